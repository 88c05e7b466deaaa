#!/usr/bin/env python3
"""Reads a bench_1p5b.sh output folder and prints one table: shardtrain for each
model, matmul dtype, recompute choice and micro-batch (steady state: steps after
--warmup; with the mean power draw and SM clock of those steps) and the torch
FSDP2 anchor runs; the best micro-batch per recompute choice; our best ratio over
each anchor run; and the op profile of our best run."""
import argparse, glob, json, os


def power(run_dir, steps, warmup):
    """Mean power draw (W) and SM clock (MHz) over the timed steps: the samples of
    <run>.power.csv between the end of step `warmup` and the end of the last step,
    placed on the wall clock by metrics.jsonl's last write (the last step's end)."""
    path = run_dir + ".power.csv"
    if not os.path.exists(path) or len(steps) <= warmup:
        return None, None
    end = os.path.getmtime(os.path.join(run_dir, "metrics.jsonl"))
    start = end - (steps[-1]["elapsed_s"] - steps[warmup - 1]["elapsed_s"])
    w, mhz = [], []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            t, pw, clk = float(parts[0]), float(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            continue
        if start <= t <= end:
            w.append(pw), mhz.append(clk)
    if not w:
        return None, None
    return sum(w) / len(w), sum(mhz) / len(mhz)


def ours(run_dir, warmup):
    steps = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "step" in r]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    timed = [s for s in steps if s["step"] > warmup]
    per_step = steps[1]["tokens"] - steps[0]["tokens"] if len(steps) > 1 else steps[0]["tokens"]
    seconds = sum(per_step / s["tokens_per_s"] for s in timed)
    tps = per_step * len(timed) / seconds / summary["world"]
    tflops = tps * summary["flops_per_token"] / 1e12
    cfg = open(os.path.join(run_dir, "config.toml")).read()
    rc, mm, model, scaling, layers, fast, ends = "none", "bf16", "?", "current", "?", "false", "0"
    rounding = "nearest"
    for line in cfg.splitlines():
        key = line.split("=", 1)[0].strip()
        val = line.split("=", 1)[1].strip().strip('"') if "=" in line else ""
        if key == "recompute":
            rc = val
        elif key == "matmul_dtype":
            mm = val
        elif key == "fp8_scaling":
            scaling = val
        elif key == "fp8_fast_accum":
            fast = val
        elif key == "fp8_bf16_end_blocks":
            ends = val
        elif key == "fp8_dlogits_rounding":
            rounding = val
        elif key == "fp8_layers":  # a TOML list: ["gate_up", "down"]
            layers = ",".join(x.strip().strip('"') for x in val.strip("[]").split(",") if x.strip())
        elif key == "preset":
            model = val
    if mm == "fp8" and scaling == "delayed":
        mm = "fp8-delayed"
    if mm.startswith("fp8") and fast == "true":
        mm += "-fast"
    if mm.startswith("fp8") and ends != "0":
        mm += "-ends" + ends
    grads = {"lm_head", "lm_head_grad"} & set(layers.split(","))
    if mm.startswith("fp8") and grads:  # the rounding acts only on the lm_head's FP8 gradient
        mm += "-sr" if rounding == "stochastic" else "-rn"
    if mm.startswith("fp8"):  # the layers always: the default has changed over time
        mm += "@" + layers
    act = None
    log = run_dir + ".log"
    if os.path.exists(log):
        for line in open(log):
            if "MiB per token" in line:
                act = float(line.split("MiB per token")[0].rsplit(",", 1)[-1].split()[-1])
    watts, mhz = power(run_dir, steps, warmup)
    return dict(impl=f"shardtrain {model} {mm} recompute={rc} mbs={summary['micro_batch']}", recompute=rc,
                model=model, matmul=mm, watts=watts, mhz=mhz,
                tokens_per_s_per_gpu=tps, tflops=tflops, mfu=tflops / 989.0,
                peak_gib=summary["peak_memory_bytes"] / 2**30, loss=steps[-1]["loss"], act=act,
                first=summary.get("first_step_after_start_s"), dir=run_dir)


def torch_run(path):
    r = json.load(open(path))
    return dict(impl=f"{r['impl']} mbs={r['mbs']}", watts=None, mhz=None, tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"],
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
          "| first step after start s | final loss | power W | SM MHz |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows + anchors:
        print(f"| {r['impl']} | {r['tokens_per_s_per_gpu']:.0f} | {r['tflops']:.1f} | {100 * r['mfu']:.1f}% | "
              f"{r['peak_gib']:.1f} | {fmt(r['act'], '.2f')} | {fmt(r['first'], '.2f')} | {r['loss']:.4f} | "
              f"{fmt(r['watts'], '.0f')} | {fmt(r['mhz'], '.0f')} |")
    if rows:
        print()
        for key in dict.fromkeys((r["model"], r["matmul"], r["recompute"]) for r in rows):
            b = max((r for r in rows if (r["model"], r["matmul"], r["recompute"]) == key),
                    key=lambda r: r["tokens_per_s_per_gpu"])
            print(f"best micro-batch for {' '.join(key)}: {b['impl']} at {b['tokens_per_s_per_gpu']:.0f} tokens/s")
        # fp8 (current or delayed scaling) over bf16, per model, best of each.
        for model in dict.fromkeys(r["model"] for r in rows):
            kinds = list(dict.fromkeys(r["matmul"] for r in rows if r["model"] == model))
            best = {mm: max((r for r in rows if r["model"] == model and r["matmul"] == mm),
                            key=lambda r: r["tokens_per_s_per_gpu"], default=None)
                    for mm in kinds}
            for mm in kinds:
                if mm != "bf16" and best.get("bf16") and best[mm]:
                    print(f"ratio {model} {mm} / bf16 (best of each): "
                          f"{best[mm]['tokens_per_s_per_gpu'] / best['bf16']['tokens_per_s_per_gpu']:.3f}x")
    if rows and anchors:
        best = max((r for r in rows if r["model"] == "qwen2.5-1.5b"), key=lambda r: r["tokens_per_s_per_gpu"],
                   default=max(rows, key=lambda r: r["tokens_per_s_per_gpu"]))
        print()
        for t in anchors:
            print(f"ratio {best['impl']} / {t['impl']}: {best['tokens_per_s_per_gpu'] / t['tokens_per_s_per_gpu']:.3f}x")
    for best in [max((r for r in rows if r["matmul"] == mm), key=lambda r: r["tokens_per_s_per_gpu"])
                 for mm in dict.fromkeys(r["matmul"] for r in rows)]:
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
