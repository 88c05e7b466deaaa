#!/usr/bin/env bash
# The real-text corpus of the FP8 parity runs, from what a Debian machine holds: the
# licence texts (/usr/share/common-licenses), every package's copyright file and every
# package changelog (decompressed), one document per file, tokenized with the Qwen2.5
# tokenizer into token shards (`shardtrain data prepare`). On a Debian 12 machine
# with this project's packages: 2,291 documents, about 49M tokens.
#
#   bench/make_corpus.sh TOKENIZER_DIR OUT [SHARDTRAIN_BINARY]
#   e.g. bench/make_corpus.sh ../shared/tokenizers/qwen2.5 data/corpus-qwen
# The texts are gathered under a temporary directory that is removed at exit; OUT is
# written by `data prepare` (which refuses an existing OUT unless --force).
set -euo pipefail
cd "$(dirname "$0")/.."
TOK=${1:?usage: bench/make_corpus.sh TOKENIZER_DIR OUT [SHARDTRAIN_BINARY]}
OUT=${2:?usage: bench/make_corpus.sh TOKENIZER_DIR OUT [SHARDTRAIN_BINARY]}
BIN=${3:-build/shardtrain}
texts=$(mktemp -d)
trap 'rm -rf "$texts"' EXIT
mkdir -p "$texts/a-licenses" "$texts/b-copyright" "$texts/c-changelog"
cp /usr/share/common-licenses/* "$texts/a-licenses/"
for f in /usr/share/doc/*/copyright; do
  cp "$f" "$texts/b-copyright/$(basename "$(dirname "$f")")"
done
find /usr/share/doc -name 'changelog*.gz' | sort | while read -r f; do
  name=$(echo "${f#/usr/share/doc/}" | tr / _)
  zcat "$f" > "$texts/c-changelog/${name%.gz}"
done
echo "make_corpus: $(find "$texts" -type f | wc -l) files, $(du -sh "$texts" | cut -f1) of text"
"$BIN" data prepare --tokenizer "$TOK" --input "$texts" --out "$OUT"
