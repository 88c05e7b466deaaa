#!/usr/bin/env bash
# Big models on one GPU: each optimizer-state choice (optim.state_dtype,
# optim.master_dtype, train.offload) with its micro-batch and recompute, side by side in
# one call: tokens/s, peak GPU memory (the trainer's own measurement and estimate), peak
# host memory (the process's VmHWM: page-locked offload memory included), the GPU's
# power draw and SM clock, and the loss at the last step against the first run's.
#
# Run from the repository root on the GPU machine:
#   bench/big_models.sh [SHARDTRAIN_BINARY] [OUT_DIR]
# Environment: MODEL (qwen2.5-7b), SEQ (2048), STEPS (20), DATA (a prepared token
# directory for real text; empty: random tokens), RUNS (one run per line,
# "name --key=value ..."; the default compares fp32 state with bf16 state and master,
# with and without offload), EXTRA (arguments for every run). The first run is the reference for the loss column, so
# for a loss comparison give every run the same micro-batch and grad_accum.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out/big}
MODEL=${MODEL:-qwen2.5-7b}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-20}
DATA=${DATA:-}
EXTRA=${EXTRA:-}
RUNS=${RUNS:-"fp32_mb2_block --train.micro_batch=2 --train.recompute=block
bf16_mb6_none --optim.state_dtype=bf16 --optim.master_dtype=bf16 --train.micro_batch=6
bf16_mb8_norm --optim.state_dtype=bf16 --optim.master_dtype=bf16 --train.micro_batch=8 --train.recompute=norm
bf16_offload_mb8_none --optim.state_dtype=bf16 --optim.master_dtype=bf16 --train.offload=optimizer --train.micro_batch=8"}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
printf '%s\n' "$RUNS" | grep -v '^ *$' > "$OUT/runs.txt"
data_args=(--data.source=random)
[ -n "$DATA" ] && data_args=(--data.source=tokens --data.paths="$DATA")
sample_power() {
  while :; do
    echo "$(date +%s.%N),$(nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits | head -1)"
    sleep 0.2
  done
}
while read -r name args; do
  [ -z "$name" ] && continue
  echo "== $MODEL $name: $args"
  sample_power > "$OUT/$name.power.csv" 2>/dev/null &
  sampler=$!
  # shellcheck disable=SC2086
  "$BIN" train --config configs/qwen2.5-1.5b.toml --model.preset="$MODEL" --train.seq_len="$SEQ" \
    --train.steps="$STEPS" --train.log_every=1 --run.progress=off "${data_args[@]}" $EXTRA $args \
    --run.out_dir="$OUT/$name" > "$OUT/$name.log" 2>&1 &
  pid=$!
  hwm=0
  while kill -0 "$pid" 2>/dev/null; do
    h=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    [ -n "$h" ] && hwm=$h
    sleep 0.5
  done
  wait "$pid"
  echo "exit $?" >> "$OUT/$name.log"
  echo "$hwm" > "$OUT/$name.host_kib"
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  grep -E "memory in step 1|^done:|^exit|out of memory|error" "$OUT/$name.log" | sed 's/^/  /'
done <<< "$RUNS"
python3 bench/big_models.py "$OUT" --warmup 5 | tee "$OUT/table.md"
