#!/usr/bin/env python3
"""Reads a bench_1p5b.sh output folder and prints one table: shardtrain at each
recompute choice and micro-batch (steady state: steps after --warmup) and the torch
FSDP2 anchor runs; the best micro-batch per recompute choice; our best ratio over
each anchor run; and the op profile of our best run."""
import argparse, glob, json, os


def ours(run_dir, warmup):
    steps = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "step" in r]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    timed = [s for s in steps if s["step"] > warmup]
    per_step = steps[1]["tokens"] - steps[0]["tokens"] if len(steps) > 1 else steps[0]["tokens"]
    seconds = sum(per_step / s["tokens_per_s"] for s in timed)
    tps = per_step * len(timed) / seconds / summary["world"]
    tflops = tps * summary["flops_per_token"] / 1e12
    cfg = open(os.path.join(run_dir, "config.toml")).read()
    rc = "none"
    for line in cfg.splitlines():
        if line.strip().startswith("recompute"):
            rc = line.split("=", 1)[1].strip().strip('"')
    act = None
    log = run_dir + ".log"
    if os.path.exists(log):
        for line in open(log):
            if "MiB per token" in line:
                act = float(line.split("MiB per token")[0].rsplit(",", 1)[-1].split()[-1])
    return dict(impl=f"shardtrain recompute={rc} mbs={summary['micro_batch']}", recompute=rc,
                tokens_per_s_per_gpu=tps, tflops=tflops, mfu=tflops / 989.0,
                peak_gib=summary["peak_memory_bytes"] / 2**30, loss=steps[-1]["loss"], act=act,
                first=summary.get("first_step_after_start_s"), dir=run_dir)


def torch_run(path):
    r = json.load(open(path))
    return dict(impl=f"{r['impl']} mbs={r['mbs']}", tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"],
                tflops=r["model_tflops_per_gpu"], mfu=r["mfu_vs_peak"], peak_gib=r["peak_mem_gib"], loss=r["loss"],
                act=None, first=None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    rows = []
    for d in sorted(p for p in glob.glob(os.path.join(a.out, "ours_*")) if os.path.isdir(p)):
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
    print("| run | tokens/s per GPU | model TFLOP/s | MFU (989) | peak memory GiB | activations MiB/token "
          "| first step after start s | final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows + anchors:
        print(f"| {r['impl']} | {r['tokens_per_s_per_gpu']:.0f} | {r['tflops']:.1f} | {100 * r['mfu']:.1f}% | "
              f"{r['peak_gib']:.1f} | {fmt(r['act'], '.2f')} | {fmt(r['first'], '.2f')} | {r['loss']:.4f} |")
    if rows:
        print()
        for rc in dict.fromkeys(r["recompute"] for r in rows):
            b = max((r for r in rows if r["recompute"] == rc), key=lambda r: r["tokens_per_s_per_gpu"])
            print(f"best micro-batch with recompute={rc}: {b['impl']} at {b['tokens_per_s_per_gpu']:.0f} tokens/s")
    if rows and anchors:
        best = max(rows, key=lambda r: r["tokens_per_s_per_gpu"])
        print()
        for t in anchors:
            print(f"ratio {best['impl']} / {t['impl']}: {best['tokens_per_s_per_gpu'] / t['tokens_per_s_per_gpu']:.3f}x")
    if rows:
        best = max(rows, key=lambda r: r["tokens_per_s_per_gpu"])
        log = best["dir"] + ".log"
        if os.path.exists(log):
            lines = open(log).read().splitlines()
            start = next((i for i, l in enumerate(lines) if l.startswith("op profile")), None)
            if start is not None:
                print()
                print(f"op profile of {best['impl']}:")
                for l in lines[start:]:
                    if not l.strip():
                        break
                    print(l)


if __name__ == "__main__":
    main()
