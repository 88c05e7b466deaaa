#!/usr/bin/env bash
# A resumed run repeats an uninterrupted one bit for bit, on whatever device: one run
# of STEPS steps saves a checkpoint every STEPS/2, a second run resumes from the
# middle one and finishes; every loss and gradient norm after the checkpoint must be
# the same double. Exits non-zero when any differs.
#   bench/resume_bits.sh [SHARDTRAIN_BINARY] [OUT_DIR] [extra train arguments...]
# e.g. bench/resume_bits.sh build/shardtrain bench-out/resume --train.device=cuda
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out/resume}
shift 2 || true
STEPS=${STEPS:-20}
export NCCL_NVLS_ENABLE=0
rm -rf "$OUT" && mkdir -p "$OUT"
A="--model.preset=tiny --train.steps=$STEPS --run.progress=off --train.log_every=5"
"$BIN" train $A "$@" --run.checkpoint_every=$((STEPS / 2)) --run.keep_last=0 --run.out_dir="$OUT/straight" \
  > "$OUT/straight.log" 2>&1 || { cat "$OUT/straight.log"; exit 1; }
"$BIN" train $A "$@" --run.resume="$OUT/straight/checkpoints/step-$((STEPS / 2))" --run.out_dir="$OUT/resumed" \
  > "$OUT/resumed.log" 2>&1 || { cat "$OUT/resumed.log"; exit 1; }
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def steps(name):
    return {j["step"]: (j["loss"], j["grad_norm"]) for j in map(json.loads, open(os.path.join(out, name, "metrics.jsonl"))) if "step" in j}
a, b = steps("straight"), steps("resumed")
common = sorted(set(a) & set(b))
same = all(a[s] == b[s] for s in common)
print("resumed steps %d-%d against the uninterrupted run: %s (final loss %r vs %r)" %
      (common[0], common[-1], "bitwise equal" if same else "DIFFERENT", a[common[-1]][0], b[common[-1]][0]))
sys.exit(0 if same and common else 1)
PY
