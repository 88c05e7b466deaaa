#!/usr/bin/env bash
# Side by side on one GPU: shardtrain against the PyTorch FSDP2 anchor
# (../shared/bench/torch_fsdp2_baseline.py, eager and --compile), Qwen2.5-1.5B (or
# another preset: MODEL),
# random token ids, the same sequence length; then one table of tokens/s per GPU,
# model TFLOP/s, MFU, peak memory, activations per token and our ratio over each,
# the best micro-batch per train.recompute choice, and the op profile of our best run
# (every run profiles steps 6-10 with run.profile; the window costs nothing outside).
#
# Run from the repository root on the GPU machine:
#   bench/bench_1p5b.sh [SHARDTRAIN_BINARY] [OUT_DIR]
# Environment: SEQ (2048), MBS (micro-batches to try, "8 16"), RECOMPUTE (choices
# to try, "none"; e.g. "none norm swiglu"), MATMUL (train.matmul_dtype values to
# try, "bf16"; "bf16 fp8" compares them; "fp8-delayed" is fp8 with train.fp8_scaling=delayed;
# "fp8-delayed@qkv,o,gate_up,down" sets train.fp8_layers; a kind ending in "-fast",
# e.g. "fp8-fast", also sets train.fp8_fast_accum=true, and one ending in "-endsN",
# e.g. "fp8-ends2@qkv,o,gate_up,down", train.fp8_bf16_end_blocks=N, and one ending in
# "-sr" or "-rn", e.g. "fp8-rn@gate_up,down,lm_head_grad", train.fp8_dlogits_rounding=
# stochastic (the default) or nearest; in that order: "fp8-fast-ends2-rn"), MODEL (presets, "qwen2.5-1.5b"; e.g.
# "qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b"; a preset may carry its own micro-batches
# after a colon, "+" between them, in place of MBS: "qwen2.5-0.5b:32 qwen2.5-1.5b:24
# qwen2.5-3b:6" runs the three sizes in one call; the anchor runs for 1.5B only), STEPS (20:
# 5 warm-up + 15 timed, as the anchor), TORCH_MBS (8: the anchor's best), TORCH (1;
# 0 skips the anchor). Every run samples the GPU's power draw and SM clock
# (nvidia-smi, every 0.2 s) into <run>.power.csv; compare.py averages the samples of
# the timed steps.
# The anchor is read from .anchor/ (copied there from ../shared/bench when present).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out}
SEQ=${SEQ:-2048}
MBS=${MBS:-"8 16"}
RECOMPUTE=${RECOMPUTE:-none}
MATMUL=${MATMUL:-bf16}
MODEL=${MODEL:-qwen2.5-1.5b}
TORCH=${TORCH:-1}
STEPS=${STEPS:-20}
TORCH_MBS=${TORCH_MBS:-8}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT" .anchor
[ -f ../shared/bench/torch_fsdp2_baseline.py ] && cp ../shared/bench/torch_fsdp2_baseline.py .anchor/
ANCHOR=.anchor/torch_fsdp2_baseline.py
if [ "$TORCH" = 1 ] && [ ! -f "$ANCHOR" ]; then
  echo "bench: $ANCHOR is missing (copy ../shared/bench/torch_fsdp2_baseline.py there, or TORCH=0)"; exit 2
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
"$BIN" --version > "$OUT/version.txt" 2>&1
# power.draw (W) and clocks.sm (MHz) with a Unix timestamp, every 0.2 s, until killed.
sample_power() {
  while :; do
    echo "$(date +%s.%N),$(nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits | head -1)"
    sleep 0.2
  done
}
has_1p5b=0
for spec in $MODEL; do
  model=${spec%%:*}
  model_mbs=$MBS
  [[ "$spec" == *:* ]] && model_mbs=$(echo "${spec#*:}" | tr '+' ' ')
  [ "$model" = qwen2.5-1.5b ] && has_1p5b=1
  for mm in $MATMUL; do
    for rc in $RECOMPUTE; do
      for mb in $model_mbs; do
        name="ours_${model}_$(echo "$mm" | tr ',@' '+-')_${rc}_mb$mb"
        kind=${mm%%@*}
        ends="" sr=""
        if [[ "$kind" =~ ^(.*)-(sr|rn)$ ]]; then
          kind=${BASH_REMATCH[1]}
          sr=$([ "${BASH_REMATCH[2]}" = sr ] && echo stochastic || echo nearest)
        fi
        if [[ "$kind" =~ ^(.*)-ends([0-9]+)$ ]]; then kind=${BASH_REMATCH[1]}; ends=${BASH_REMATCH[2]}; fi
        base=${kind%-fast}
        mm_args=(--train.matmul_dtype="$base")
        [ "$base" = fp8-delayed ] && mm_args=(--train.matmul_dtype=fp8 --train.fp8_scaling=delayed)
        [ "$base" != "$kind" ] && mm_args+=(--train.fp8_fast_accum=true)
        [ -n "$ends" ] && mm_args+=(--train.fp8_bf16_end_blocks="$ends")
        [ -n "$sr" ] && mm_args+=(--train.fp8_dlogits_rounding="$sr")
        [[ "$mm" == *@* ]] && mm_args+=(--train.fp8_layers="${mm#*@}")
        echo "== shardtrain $model matmul $mm, recompute $rc, micro-batch $mb"
        sample_power > "$OUT/$name.power.csv" 2>/dev/null &
        sampler=$!
        "$BIN" train --config configs/qwen2.5-1.5b.toml --model.preset="$model" --train.seq_len="$SEQ" \
          --train.micro_batch="$mb" --train.recompute="$rc" "${mm_args[@]}" --train.steps="$STEPS" \
          --train.log_every=1 --run.progress=off --run.profile=true --run.profile_warmup=5 --run.profile_steps=5 \
          --run.out_dir="$OUT/$name" > "$OUT/$name.log" 2>&1
        echo "exit $?" >> "$OUT/$name.log"
        kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
        grep -E "first step done|^done:|^exit|out of memory" "$OUT/$name.log"
      done
    done
  done
done
if [ "$TORCH" = 1 ] && [ "$has_1p5b" = 1 ]; then
  for mode in eager compile; do
    echo "== torch FSDP2 $mode"
    flag=""; [ "$mode" = compile ] && flag="--compile"
    python3 "$ANCHOR" --size 1.5b --seq "$SEQ" --mbs "$TORCH_MBS" --steps 15 $flag > "$OUT/torch_$mode.log" 2>&1
    grep '^{' "$OUT/torch_$mode.log" | tail -1 > "$OUT/torch_$mode.json"
    tail -1 "$OUT/torch_$mode.log"
  done
fi
python3 bench/compare.py "$OUT" --warmup 5 | tee "$OUT/table.md"
