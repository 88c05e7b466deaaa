#!/usr/bin/env bash
# The multi-GPU run on one host with N GPUs (N = all visible, or $NGPU), in stages:
#   scaling     Qwen2.5-1.5B, seq 2048, random tokens: shardtrain on 1 GPU and on N
#               GPUs (full shard), and the PyTorch FSDP2 anchor on 1 and N GPUs
#               (torchrun), all in this call
#   parity      the tiny model, 50 steps, on 1 GPU (grad_accum N) and on N GPUs
#               (grad_accum 1): the same global batch, so the same loss curve
#   transports  for NVLink (P2P), NCCL_P2P_DISABLE=1 (SHM), and P2P + SHM disabled
#               (NET/Socket over loopback): `shardtrain nccl-check` with
#               --expect-transport nvlink (must fail for the last two), its NCCL logs,
#               its bus bandwidth, and the training tokens/s with the same settings
# then bench/multi_gpu_report.py prints the tables for docs/performance.md.
#
# Run from the repository root on the GPU machine:
#   bench/multi_gpu.sh [SHARDTRAIN_BINARY] [OUT_DIR]
# Environment: STAGES ("scaling parity transports"), NGPU (all), MBS (8), SEQ (2048),
# STEPS (20: 5 warm-up + 15 timed, as the anchor), TSTEPS (10: training steps per
# transport), MAX_BYTES (268435456: largest nccl-check buffer).
# The anchor is read from .anchor/ (copied there from ../shared/bench when present).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/shardtrain}
OUT=${2:-bench-out/multi}
STAGES=${STAGES:-"scaling parity transports"}
N=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
MBS=${MBS:-8}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-20}
TSTEPS=${TSTEPS:-10}
MAX_BYTES=${MAX_BYTES:-268435456}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT" .anchor
[ -f ../shared/bench/torch_fsdp2_baseline.py ] && cp ../shared/bench/torch_fsdp2_baseline.py .anchor/
ANCHOR=.anchor/torch_fsdp2_baseline.py
((N >= 1)) || { echo "multi_gpu: no GPU visible"; exit 2; }
echo "$N" > "$OUT/ngpu.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
"$BIN" --version > "$OUT/version.txt" 2>&1
T0=$(date +%s)
stamp() { echo "multi_gpu: $1 ($(($(date +%s) - T0)) s)"; }
# run NAME CMD...: output to $OUT/NAME.log, exit status appended to it
run() {
  local name=$1; shift
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "exit $rc" >> "$OUT/$name.log"
  stamp "$name: exit $rc"
}

A=(--config configs/qwen2.5-1.5b.toml --train.seq_len="$SEQ" --train.micro_batch="$MBS"
   --train.steps="$STEPS" --train.log_every=5 --run.progress=off)
if [[ " $STAGES " == *" scaling "* ]]; then
  run ours_1 "$BIN" train "${A[@]}" --run.out_dir="$OUT/ours_1"
  run ours_N "$BIN" launch --nproc-per-node "$N" -- train "${A[@]}" --run.out_dir="$OUT/ours_N"
  if [ -f "$ANCHOR" ]; then
    run torch_1 python3 "$ANCHOR" --size 1.5b --seq "$SEQ" --mbs "$MBS" --steps 15
    run torch_N torchrun --standalone --nproc-per-node "$N" "$ANCHOR" --size 1.5b --seq "$SEQ" --mbs "$MBS" --steps 15
  else
    stamp "no $ANCHOR: torch runs skipped"
  fi
fi

if [[ " $STAGES " == *" parity "* ]]; then
  P=(--config configs/tiny.toml --train.device=cuda --train.steps=50 --train.micro_batch=8 --train.log_every=1
     --run.progress=off)
  run parity_1 "$BIN" train "${P[@]}" --train.grad_accum="$N" --run.out_dir="$OUT/parity_1"
  run parity_N "$BIN" launch --nproc-per-node "$N" -- train "${P[@]}" --train.grad_accum=1 --run.out_dir="$OUT/parity_N"
fi

if [[ " $STAGES " == *" transports "* ]]; then
  for mode in p2p shm socket; do
    (
      case $mode in
        shm) export NCCL_P2P_DISABLE=1 ;;
        socket) export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 ;;
      esac
      run "check_$mode" "$BIN" launch --nproc-per-node "$N" -- nccl-check --expect-transport nvlink --json \
        --fabric.log_dir="$OUT/nccl_$mode" --max-bytes="$MAX_BYTES" --iters 10
      # The sweep itself, whatever the transport (the expectation above stops before it).
      run "sweep_$mode" "$BIN" launch --nproc-per-node "$N" -- nccl-check --json \
        --fabric.log_dir="$OUT/nccl_sweep_$mode" --max-bytes="$MAX_BYTES" --iters 10
      run "train_$mode" "$BIN" launch --nproc-per-node "$N" -- train "${A[@]}" --train.steps="$TSTEPS" \
        --run.out_dir="$OUT/train_$mode"
    )
  done
fi
python3 bench/multi_gpu_report.py "$OUT" | tee "$OUT/report.md"
