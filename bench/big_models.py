#!/usr/bin/env python3
"""Reads a bench/big_models.sh output folder: one row per run (in the order run) with
tokens/s (steps after --warmup), peak GPU memory measured and the trainer's estimate,
peak host memory, mean power and SM clock over the timed steps, and the last step's
loss with its difference from the first run's at the same step."""
import argparse, json, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import power  # noqa: E402


def row(out, name, warmup):
    d = os.path.join(out, name)
    metrics = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(metrics):
        return dict(name=name, failed=True)
    steps = [r for r in map(json.loads, open(metrics)) if "step" in r]
    if len(steps) <= warmup:
        return dict(name=name, failed=True)
    summary = json.load(open(os.path.join(d, "summary.json")))
    timed = [s for s in steps if s["step"] > warmup]
    per_step = steps[1]["tokens"] - steps[0]["tokens"]
    seconds = sum(per_step / s["tokens_per_s"] for s in timed)
    est = None
    for line in open(d + ".log"):
        m = re.search(r"peak ([\d.]+) GiB measured, ([\d.]+) GiB estimated", line)
        if m:
            est = float(m.group(2))
    host_kib = int(open(os.path.join(out, name + ".host_kib")).read().strip() or 0)
    watts, mhz = power(d, steps, warmup)
    return dict(name=name, failed=False, tps=per_step * len(timed) / seconds,
                peak=summary["peak_memory_bytes"] / 2**30, est=est, host=host_kib / 2**20, watts=watts, mhz=mhz,
                losses={s["step"]: s["loss"] for s in steps}, last=steps[-1]["step"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    names = [l.split()[0] for l in open(os.path.join(a.out, "runs.txt"))] if os.path.exists(
        os.path.join(a.out, "runs.txt")) else sorted(f[:-4] for f in os.listdir(a.out) if f.endswith(".log"))
    rows = [row(a.out, n, a.warmup) for n in names]
    ref = next((r for r in rows if not r["failed"]), None)
    print("| run | tokens/s | GPU peak GiB (estimate) | host peak GiB | W | SM MHz | loss at last step | vs first run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["failed"]:
            print(f"| {r['name']} | failed (see {r['name']}.log) | | | | | | |")
            continue
        rl = ref["losses"].get(r["last"]) if ref else None
        diff = f"{100 * (r['losses'][r['last']] - rl) / rl:+.2f}%" if rl else ""
        w = f"{r['watts']:.0f}" if r["watts"] else ""
        mhz = f"{r['mhz']:.0f}" if r["mhz"] else ""
        est = f" ({r['est']:.1f})" if r["est"] else ""
        print(f"| {r['name']} | {r['tps']:.0f} | {r['peak']:.1f}{est} | {r['host']:.1f} | {w} | {mhz} | "
              f"{r['losses'][r['last']]:.4f} | {diff} |")


if __name__ == "__main__":
    main()
