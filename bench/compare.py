#!/usr/bin/env python3
"""Reads a bench_1p5b.sh output folder and prints one table: shardtrain at each
micro-batch (steady state: steps after --warmup) and the torch FSDP2 anchor runs,
with our best ratio over each anchor run."""
import argparse, glob, json, os


def ours(run_dir, warmup):
    steps = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "step" in r]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    timed = [s for s in steps if s["step"] > warmup]
    per_step = steps[1]["tokens"] - steps[0]["tokens"] if len(steps) > 1 else steps[0]["tokens"]
    seconds = sum(per_step / s["tokens_per_s"] for s in timed)
    tps = per_step * len(timed) / seconds / summary["world"]
    tflops = tps * summary["flops_per_token"] / 1e12
    return dict(impl=f"shardtrain mbs={summary['micro_batch']}", tokens_per_s_per_gpu=tps, tflops=tflops,
                mfu=tflops / 989.0, peak_gib=summary["peak_memory_bytes"] / 2**30, loss=steps[-1]["loss"])


def torch_run(path):
    r = json.load(open(path))
    return dict(impl=f"{r['impl']} mbs={r['mbs']}", tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"],
                tflops=r["model_tflops_per_gpu"], mfu=r["mfu_vs_peak"], peak_gib=r["peak_mem_gib"], loss=r["loss"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    rows = []
    for d in sorted(p for p in glob.glob(os.path.join(a.out, "ours_mb*")) if os.path.isdir(p)):
        try:
            rows.append(ours(d, a.warmup))
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"(no result from {d}: {e})")
    anchors = []
    for mode in ("eager", "compile"):
        p = os.path.join(a.out, f"torch_{mode}.json")
        try:
            anchors.append(torch_run(p))
        except (OSError, ValueError, KeyError) as e:
            print(f"(no result from {p}: {e})")
    print("| run | tokens/s per GPU | model TFLOP/s | MFU (989) | peak memory GiB | final loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows + anchors:
        print(f"| {r['impl']} | {r['tokens_per_s_per_gpu']:.0f} | {r['tflops']:.1f} | {100 * r['mfu']:.1f}% | "
              f"{r['peak_gib']:.1f} | {r['loss']:.4f} |")
    if rows and anchors:
        best = max(rows, key=lambda r: r["tokens_per_s_per_gpu"])
        print()
        for t in anchors:
            print(f"ratio {best['impl']} / {t['impl']}: {best['tokens_per_s_per_gpu'] / t['tokens_per_s_per_gpu']:.3f}x")


if __name__ == "__main__":
    main()
