#!/usr/bin/env bash
# Two builds, the same GPU runs, compared bit for bit: for a change that must not
# alter results (a refactor), run the binary from before and the one from after on
# the tiny model (50 steps) and Qwen2.5-1.5B (20 steps, seq 2048, micro-batch 8),
# plain and through the NCCL path (`launch --nproc-per-node 1`), and compare every
# step's loss and gradient norm. Prints one line per pair and exits non-zero when
# any pair differs.
#
# Run from the repository root on the GPU machine:
#   bench/same_bits.sh OLD_BINARY NEW_BINARY OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: bench/same_bits.sh OLD_BINARY NEW_BINARY OUT_DIR}
NEW=${2:?usage: bench/same_bits.sh OLD_BINARY NEW_BINARY OUT_DIR}
OUT=${3:?usage: bench/same_bits.sh OLD_BINARY NEW_BINARY OUT_DIR}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
TINY="--train.device=cuda --train.steps=50 --train.log_every=10 --run.progress=off"
BIG="--config configs/qwen2.5-1.5b.toml --train.micro_batch=8 --train.steps=20 --train.log_every=5 --run.progress=off"

run() {  # name binary args...
  local name=$1 bin=$2
  shift 2
  "$bin" "$@" --run.out_dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$OUT/$name.log"
}
launch1() {  # name binary args...
  local name=$1 bin=$2
  shift 2
  "$bin" launch --nproc-per-node 1 -- train "$@" --run.out_dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$OUT/$name.log"
}

run tiny_old "$OLD" train $TINY
run tiny_new "$NEW" train $TINY
launch1 tiny_new_nccl "$NEW" $TINY
run big_old "$OLD" train $BIG
run big_new "$NEW" train $BIG
launch1 big_new_nccl "$NEW" $BIG

status=0
compare() {  # a b
  python3 - "$OUT/$1/metrics.jsonl" "$OUT/$2/metrics.jsonl" "$1 vs $2" <<'PY' || status=1
import json, sys
def steps(p):
    try:
        return [json.loads(l) for l in open(p) if '"step"' in l]
    except OSError as e:
        return str(e)
a, b = steps(sys.argv[1]), steps(sys.argv[2])
if isinstance(a, str) or isinstance(b, str) or not a or len(a) != len(b):
    print(f"{sys.argv[3]}: cannot compare ({a if isinstance(a, str) else len(a)} / {b if isinstance(b, str) else len(b)} steps)")
    sys.exit(1)
diff = [x["step"] for x, y in zip(a, b) if x["loss"] != y["loss"] or x["grad_norm"] != y["grad_norm"]]
print(f"{sys.argv[3]}: {len(a) - len(diff)} of {len(a)} steps bitwise equal (loss and grad_norm)"
      + (f"; first differing step {diff[0]}" if diff else "") + f"; final loss {a[-1]['loss']:.6f}")
sys.exit(1 if diff else 0)
PY
}
{
  compare tiny_old tiny_new
  compare tiny_new tiny_new_nccl
  compare big_old big_new
  compare big_new big_new_nccl
  grep -h "memory in step 1\|done:" "$OUT"/big_new.log "$OUT"/big_old.log
} | tee "$OUT/same_bits.txt"
exit $status
