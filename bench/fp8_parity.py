#!/usr/bin/env python3
"""Compares two runs' loss curves step by step (metrics.jsonl): the relative
difference |b - a| / a at every logged step after --skip, the worst of them, and
whether all are within --tol; then the signed gap (b - a) / a: its mean over the steps
(a bias: b runs above or below a) and its mean in each window of --window steps.
Exit 0 within, 1 outside, 2 on unreadable input.

Two runs of the same precision differ too once their rounding differs (another
micro-batch split, say): compare that pair the same way for the noise floor. With
--floor RUN (repeatable: such bf16 runs), the floor's own gap from a is printed too, and
b is also held to the band the bf16 runs span: at each step its distance below the
lowest or above the highest of them, relative to that run, must be within --tol. The
exit status then follows the band check (0 within, 1 outside); the plain check against
a alone is still printed.

With --mean-over K each run's loss at step s is the mean of its steps s-K+1..s, compared
at the steps that are multiples of K (what a trainer logging every K steps with the
interval's mean loss prints): the step-to-step noise of single batches averages out,
the drift between runs does not."""
import argparse, json, os, sys


def losses(run_dir):
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "step" in r and "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def interval_means(curve, k):
    """Each multiple s of k whose steps s-k+1..s are all there: their mean loss."""
    if k <= 1:
        return curve
    return {s: sum(curve[t] for t in range(s - k + 1, s + 1)) / k
            for s in curve if s % k == 0 and all(t in curve for t in range(s - k + 1, s + 1))}


def listed(steps):
    """The first 12 of a list of steps, for a message."""
    return ", ".join(str(s) for s in steps[:12]) + (", ..." if len(steps) > 12 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="the reference run (bf16)")
    ap.add_argument("b", help="the run compared with it (fp8)")
    ap.add_argument("--skip", type=int, default=50)
    ap.add_argument("--tol", type=float, default=0.01)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--mean-over", type=int, default=1, metavar="K",
                    help="compare the mean loss of each K steps, at the multiples of K (default 1: every step)")
    ap.add_argument("--floor", action="append", default=[],
                    help="a run of a's precision that differs from a only in rounding (repeatable)")
    args = ap.parse_args()
    if args.mean_over < 1:
        ap.error("--mean-over must be at least 1")
    try:
        a, b = interval_means(losses(args.a), args.mean_over), interval_means(losses(args.b), args.mean_over)
        floors = [interval_means(losses(f), args.mean_over) for f in args.floor]
    except (OSError, ValueError) as e:
        print(f"fp8_parity: {e}")
        return 2
    steps = sorted(s for s in a if s in b and s > args.skip and all(s in f for f in floors))
    if not steps:
        print(f"fp8_parity: no common steps after {args.skip}")
        return 2
    if args.mean_over > 1:
        print(f"losses: each the mean of {args.mean_over} steps, at every step that is a multiple of {args.mean_over}")
    rel = {s: abs(b[s] - a[s]) / abs(a[s]) for s in steps}
    worst = max(steps, key=rel.get)
    mean = sum(rel.values()) / len(rel)
    for s in steps:
        if s % 50 == 0 or s == steps[-1]:
            print(f"step {s:4d}  a {a[s]:.4f}  b {b[s]:.4f}  |b-a|/a {100 * rel[s]:.2f}%")
    print(f"{len(steps)} steps after {args.skip}: mean |b-a|/a {100 * mean:.3f}%, worst {100 * rel[worst]:.3f}% "
          f"at step {worst}; final a {a[steps[-1]]:.4f} b {b[steps[-1]]:.4f}")
    signed = {s: (b[s] - a[s]) / abs(a[s]) for s in steps}
    windows = []
    for lo in range(args.skip, steps[-1], args.window):
        w = [signed[s] for s in steps if lo < s <= lo + args.window]
        if w:
            windows.append(f"{100 * sum(w) / len(w):+.2f}")
    print(f"signed gap (b-a)/a: mean {100 * sum(signed.values()) / len(signed):+.3f}%; by {args.window}-step "
          f"window: {' '.join(windows)} (%)")
    ok = rel[worst] <= args.tol
    over = [s for s in steps if rel[s] > args.tol]
    print(f"within {100 * args.tol:.1f}% at every step after {args.skip}: {'yes' if ok else 'NO'}"
          + ("" if ok else f" ({len(over)} of {len(steps)} steps over: {listed(over)})"))
    if not floors:
        return 0 if ok else 1
    for name, f in zip(args.floor, floors):
        fr = {s: abs(f[s] - a[s]) / abs(a[s]) for s in steps}
        fw = max(steps, key=fr.get)
        print(f"floor {name} against a: worst {100 * fr[fw]:.3f}% at step {fw}, "
              f"{sum(1 for s in steps if fr[s] > args.tol)} of {len(steps)} steps over {100 * args.tol:.1f}%")
    gap = {}
    for s in steps:
        refs = [a[s]] + [f[s] for f in floors]
        lo, hi = min(refs), max(refs)
        gap[s] = (lo - b[s]) / abs(lo) if b[s] < lo else (b[s] - hi) / abs(hi) if b[s] > hi else 0.0
    bw = max(steps, key=gap.get)
    bover = [s for s in steps if gap[s] > args.tol]
    inside = sum(1 for s in steps if gap[s] == 0.0)
    print(f"band of the {1 + len(floors)} bf16 runs: b inside it at {inside} of {len(steps)} steps, "
          f"furthest outside {100 * gap[bw]:.3f}% at step {bw}")
    print(f"within {100 * args.tol:.1f}% of the band at every step after {args.skip}: "
          + ("yes" if not bover else f"NO ({len(bover)} of {len(steps)} steps over: {listed(bover)})"))
    return 0 if not bover else 1


if __name__ == "__main__":
    sys.exit(main())
