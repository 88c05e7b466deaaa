#!/usr/bin/env bash
# FP8 loss parity: the same model, data, seed and schedule trained twice, with
# train.matmul_dtype = bf16 and = fp8, then the two loss curves compared step by step
# (bench/fp8_parity.py: |fp8 - bf16| / bf16 at every logged step after SKIP) and drawn
# side by side by `shardtrain report` (OUT/parity.html).
#
# Run from the repository root on the GPU machine:
#   bench/fp8_parity.sh [SHARDTRAIN_BINARY] [OUT_DIR]
# Environment: DATA (a prepared token directory, `shardtrain data prepare`; required),
# MODEL (qwen2.5-0.5b), STEPS (400), MB (micro-batch, 8), ACCUM (train.grad_accum, 4:
# MB x ACCUM x SEQ = 65,536 tokens a step; at 16,384 a bf16 run at another micro-batch
# split misses bf16 by 3% at its worst step, at 65,536 by 0.9%, at 131,072 by 1.7%),
# SEQ (2048), LR (3e-4),
# WARMUP (20), SKIP (50: steps the comparison leaves out), TOL (0.01), MATMULS ("bf16
# fp8": bf16 first, each other one compared with it; "fp8-delayed" is fp8 with
# train.fp8_scaling=delayed), VARIANTS (more runs, each compared with bf16: "label
# --key=value ... / label --key=value ...", the options after the common ones, e.g.
# "mlp --train.matmul_dtype=fp8 --train.fp8_layers=gate_up,down / floor
# --train.micro_batch=4 --train.grad_accum=8"; a bf16 run at another micro-batch split is
# the noise floor: the same math, other rounding), FLOOR (1: after the MATMULS runs, a
# bf16 run "floor" at micro-batch MB/2 x ACCUM*2, unless a VARIANT is called floor; each
# FP8 run is then also held to the band the two bf16 runs span, `fp8_parity.py --floor`,
# and the exit status follows that check; 0: no floor run, the plain check decides),
# MEAN_OVER (1: every step compared; K: the means of each K steps, at the multiples of K,
# as a trainer logging every K steps with the interval's mean loss would print them,
# `fp8_parity.py --mean-over K`).
# Exit status: 0 when every compared run passes, 1 when one does not.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out/fp8-parity}
DATA=${DATA:?set DATA to a prepared token directory (shardtrain data prepare)}
MODEL=${MODEL:-qwen2.5-0.5b}
STEPS=${STEPS:-400}
MB=${MB:-8}
ACCUM=${ACCUM:-4}
SEQ=${SEQ:-2048}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-20}
SKIP=${SKIP:-50}
TOL=${TOL:-0.01}
MEAN_OVER=${MEAN_OVER:-1}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
MATMULS=${MATMULS:-"bf16 fp8"}
VARIANTS=${VARIANTS:-}
run_one() {  # label, then the options that make it
  local name=$1
  shift
  echo "== $MODEL, $name, $STEPS steps"
  "$BIN" train --config configs/qwen2.5-1.5b.toml --model.preset="$MODEL" --data.source=tokens \
    --data.paths="$DATA" --train.seq_len="$SEQ" --train.micro_batch="$MB" --train.grad_accum="$ACCUM" --train.steps="$STEPS" \
    --train.log_every=1 --optim.lr="$LR" --optim.warmup_steps="$WARMUP" "$@" \
    --run.progress=off --run.out_dir="$OUT/parity_$name" > "$OUT/parity_$name.log" 2>&1
  echo "exit $?" >> "$OUT/parity_$name.log"
  grep -E "^matmuls:|^done:|^exit|error" "$OUT/parity_$name.log"
}
names=()
for mm in $MATMULS; do
  mm_args=(--train.matmul_dtype="$mm")
  [ "$mm" = fp8-delayed ] && mm_args=(--train.matmul_dtype=fp8 --train.fp8_scaling=delayed)
  run_one "$mm" "${mm_args[@]}"
  names+=("$mm")
done
if [ -n "$VARIANTS" ]; then
  IFS='/' read -ra variants <<< "$VARIANTS"
  for v in "${variants[@]}"; do
    read -ra words <<< "$v"
    [ ${#words[@]} -eq 0 ] && continue
    run_one "${words[@]}"
    names+=("${words[0]}")
  done
fi
# A finished floor run of these settings in OUT (an earlier call's) is kept, not rerun.
floor_done() {
  local d=$OUT/parity_floor
  grep -q "^exit 0" "$OUT/parity_floor.log" 2>/dev/null &&
    grep -q "\"step\": *$STEPS[,}]" "$d/metrics.jsonl" 2>/dev/null &&
    grep -qx "micro_batch = $((MB / 2))" "$d/config.toml" && grep -qx "grad_accum = $((ACCUM * 2))" "$d/config.toml" &&
    grep -qx "seq_len = $SEQ" "$d/config.toml" && grep -q "^paths = .*$(basename "$DATA")" "$d/config.toml"
}
if [ "${FLOOR:-1}" = 1 ] && [[ " ${names[*]} " != *" floor "* ]]; then
  if [ $((MB % 2)) -eq 0 ]; then
    if floor_done; then
      echo "== $MODEL, floor: $OUT/parity_floor has finished $STEPS steps at these settings; kept"
    else
      run_one floor --train.matmul_dtype=bf16 --train.micro_batch=$((MB / 2)) --train.grad_accum=$((ACCUM * 2))
    fi
    names+=(floor)
  else
    echo "(no floor run: MB=$MB does not halve)"
  fi
fi
floor_args=()
[ "${FLOOR:-1}" = 1 ] && [ -f "$OUT/parity_floor/metrics.jsonl" ] && floor_args=(--floor "$OUT/parity_floor")
runs=() labels=()
for mm in "${names[@]}"; do runs+=("$OUT/parity_$mm"); labels+=(--label "$mm"); done
"$BIN" report "${runs[@]}" "${labels[@]}" \
  --title "$MODEL: fp8 against bf16 matmuls, $STEPS steps" --out "$OUT/parity.html"
status=0
for mm in "${names[@]}"; do
  [ "$mm" = bf16 ] && continue
  echo "== $mm against bf16"
  extra=("${floor_args[@]}")
  [ "$mm" = floor ] && extra=()
  python3 bench/fp8_parity.py "$OUT/parity_bf16" "$OUT/parity_$mm" --skip "$SKIP" --tol "$TOL" --mean-over "$MEAN_OVER" "${extra[@]}" \
    > "$OUT/parity_$mm.txt"
  rc=$?
  cat "$OUT/parity_$mm.txt"
  [ "$mm" != floor ] && [ $rc -ne 0 ] && status=1
done
exit $status
