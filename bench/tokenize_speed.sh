#!/usr/bin/env bash
# Single-thread encoding speed of shardtrain's Qwen2 tokenizer, and of the reference
# (Hugging Face tokenizers) on the same text when it is installed: the licence texts of
# /usr/share/common-licenses concatenated (or FILE), encoded line by line.
#
#   bench/tokenize_speed.sh [BINARY] [TOKENIZER_DIR] [FILE]
# The reference runs when Python's `tokenizers` imports, or with NODE_MODULES=DIR
# (npm install tokenizers in DIR; see scripts/make_tokenizer_fixture.py).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
TOK=${2:-../shared/tokenizers/qwen2.5}
FILE=${3:-}
if [ -z "$FILE" ]; then
  FILE=$(mktemp /tmp/st_tokenize_bench.XXXXXX)
  trap 'rm -f "$FILE"' EXIT
  cat /usr/share/common-licenses/* > "$FILE"
fi
echo "== shardtrain"
"$BIN" tokenize --tokenizer "$TOK" --file "$FILE" --bench
if [ -n "${NODE_MODULES:-}" ]; then
  echo "== reference (Node binding)"
  python3 scripts/make_tokenizer_fixture.py --tokenizer "$TOK" --bench "$FILE" --node-modules "$NODE_MODULES"
elif python3 -c 'import tokenizers' 2>/dev/null; then
  echo "== reference (Python)"
  python3 scripts/make_tokenizer_fixture.py --tokenizer "$TOK" --bench "$FILE"
else
  echo "== reference: not installed (pip install tokenizers, or NODE_MODULES=DIR with npm's tokenizers)"
fi
