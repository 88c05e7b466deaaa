#!/usr/bin/env bash
# Checkpoint cost on one GPU: Qwen2.5-1.5B (fp32 masters + AdamW m and v, about
# 18.5 GB) saved every 10 steps of a 30-step run (in the background; the last one
# waited for), then loaded by a run resuming to
# step 35; the step times around a save against a run without checkpoints.
# Run from the repository root on the GPU machine:
#   bench/checkpoint_1p5b.sh [SHARDTRAIN_BINARY] [OUT_DIR] [CHECKPOINT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out}
CK=${3:-/tmp/shardtrain-ck}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
rm -rf "$CK"
A="--config configs/qwen2.5-1.5b.toml --train.micro_batch=8 --train.log_every=1 --run.progress=off"
"$BIN" train $A --train.steps=30 --run.resume=none --run.out_dir="$OUT/plain" > "$OUT/plain.log" 2>&1
echo "exit $?" >> "$OUT/plain.log"
"$BIN" train $A --train.steps=30 --run.checkpoint_every=10 --run.keep_last=1 --run.checkpoint_dir="$CK" \
  --run.resume=none --run.out_dir="$OUT/save" > "$OUT/save.log" 2>&1
echo "exit $?" >> "$OUT/save.log"
du -sb "$CK"/step-* >> "$OUT/save.log" 2>&1
sync
"$BIN" train $A --train.steps=35 --run.checkpoint_dir="$CK" --run.out_dir="$OUT/resume" > "$OUT/resume.log" 2>&1
echo "exit $?" >> "$OUT/resume.log"
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def steps(name):
    return [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl")) if '"step"' in l]
plain, save = steps("plain"), steps("save")
for name in ("plain", "save"):
    s = steps(name)
    print(name, "elapsed_s:", " ".join("%d:%.2f" % (x["step"], x["elapsed_s"]) for x in s))
for log in ("save.log", "resume.log"):
    for l in open(os.path.join(out, log)):
        if "checkpoint" in l or "resumed:" in l or "/step-" in l or l.startswith("exit"):
            print(log, l.rstrip())
a = [x["loss"] for x in plain]; b = [x["loss"] for x in save]
print("plain vs save losses bitwise equal:", a == b)
r = steps("resume")
print("resumed steps:", [x["step"] for x in r][:3], "...")
PY
