#!/usr/bin/env python3
"""Reads a run's TensorBoard events with TensorBoard's own reader and says what it holds.

    scripts/check_tb_events.py RUN_DIR [--require TAG ...] [--steps N]

RUN_DIR is a run directory (<run.out_dir>, whose events are in tb/) or the tb/
directory itself. Every scalar tag is printed with how many steps it has, its first
and last step, and its first and last values. The exit status is 1 when a required
tag is missing (by default every tag shardtrain writes per step), when a tag has a
step twice, or when --steps N is given and a tag has not exactly steps 1..N; 2 when
the directory holds no events or tensorboard is not installed.

It uses tensorboard.backend.event_processing.event_accumulator.EventAccumulator,
which merges the events files of a directory the way TensorBoard does (a resumed
run's SessionLog START drops what earlier files hold from its step on).
"""
import argparse
import os
import sys

# What shardtrain writes at every step (src/metrics/tb_events.cpp, step_scalar_tags).
STEP_TAGS = [
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "perf/tokens_per_s",
    "perf/step_s",
    "perf/tflops_per_rank",
    "perf/mfu",
    "memory/peak_allocated_gib",
    "comm/bytes_sent",
    "comm/inter_node_bytes",
    "comm/blocked_s",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="<run.out_dir> or its tb/ directory")
    ap.add_argument("--require", action="append", metavar="TAG",
                    help="a tag that must be present (repeatable; default: every per-step tag)")
    ap.add_argument("--steps", type=int, help="each required tag must hold exactly steps 1..N")
    args = ap.parse_args()

    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        print(f"check_tb_events: tensorboard is not installed ({e}); pip install tensorboard", file=sys.stderr)
        return 2

    tb_dir = args.run_dir
    if os.path.isdir(os.path.join(tb_dir, "tb")):
        tb_dir = os.path.join(tb_dir, "tb")
    files = sorted(f for f in os.listdir(tb_dir) if "tfevents" in f) if os.path.isdir(tb_dir) else []
    if not files:
        print(f"check_tb_events: {tb_dir}: no events files (events.out.tfevents.*)", file=sys.stderr)
        return 2
    print(f"{tb_dir}: {len(files)} events file(s): {', '.join(files)}")

    # size_guidance 0: keep every value (the default samples scalars down to 10000).
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = sorted(acc.Tags().get("scalars", []))
    ok = True
    for tag in tags:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        first, last = events[0], events[-1]
        print(f"  {tag:28s} {len(events):6d} steps ({first.step}..{last.step})  "
              f"first {first.value:.6g}  last {last.value:.6g}")
        if len(set(steps)) != len(steps):
            print(f"check_tb_events: {tag}: a step appears more than once", file=sys.stderr)
            ok = False

    required = args.require or STEP_TAGS
    for tag in required:
        if tag not in tags:
            print(f"check_tb_events: required tag '{tag}' is missing", file=sys.stderr)
            ok = False
        elif args.steps is not None:
            steps = sorted(e.step for e in acc.Scalars(tag))
            if steps != list(range(1, args.steps + 1)):
                print(f"check_tb_events: {tag}: steps {steps[:3]}...{steps[-3:]} ({len(steps)}), "
                      f"expected 1..{args.steps}", file=sys.stderr)
                ok = False
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
