#!/usr/bin/env bash
# Packs the shared libraries a shardtrain binary needs beyond glibc, libstdc++ and
# CUDA (OpenBLAS, toml++, Gloo and their dependencies) into one tar.xz, so that a
# binary built here runs on a machine that lacks the Debian -dev packages (e.g. a GPU
# host with only the CUDA toolkit). There: tar -xJf libs.tar.xz -C DIR and put DIR
# on LD_LIBRARY_PATH.
#   scripts/bundle_libs.sh build/shardtrain out/libs.tar.xz
set -euo pipefail
bin=${1:?usage: scripts/bundle_libs.sh BINARY OUT.tar.xz}
out=${2:?usage: scripts/bundle_libs.sh BINARY OUT.tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*|ld-linux*) ;;  # the host's own
    libcuda*|libcudart*|libcublas*|libnccl*|libcudnn*|libnvrtc*) ;;                     # from the host's CUDA
    *) cp -L "$path" "$stage/$name" ;;
  esac
done
mkdir -p "$(dirname "$out")"
tar -cJf "$out" -C "$stage" .
echo "bundle_libs: $(ls "$stage" | wc -l) libraries -> $out"
