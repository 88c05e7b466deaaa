#!/usr/bin/env python3
"""Reads a bench/multi_gpu.sh output folder and prints markdown tables: scaling (tokens/s
per GPU on 1 and N GPUs, efficiency, our ratio over the torch anchor at each size), loss
parity (1 GPU with grad_accum N against N GPUs), and transports (what NCCL chose, the
nvlink expectation's verdict, bus bandwidth at the largest size, training tokens/s)."""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ours  # noqa: E402


def json_lines(path):
    """JSON objects on the lines of a log (launch prefixes each line with "[rank r] ")."""
    out = []
    try:
        for line in open(path, errors="replace"):
            i = line.find("{")
            if i < 0:
                continue
            try:
                out.append(json.loads(line[i:]))
            except ValueError:
                pass
    except OSError:
        pass
    return out


def exit_status(path):
    try:
        m = re.findall(r"^exit (\d+)$", open(path, errors="replace").read(), re.M)
        return int(m[-1]) if m else None
    except OSError:
        return None


def steps(run_dir):
    try:
        return [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "step" in r]
    except (OSError, ValueError):
        return []


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def scaling(out, n, warmup):
    print(f"### Scaling: Qwen2.5-1.5B, 1 vs {n} GPUs\n")
    print("| run | GPUs | tokens/s per GPU | model TFLOP/s per GPU | peak GiB | scaling efficiency |")
    print("|---|---:|---:|---:|---:|---:|")
    res = {}
    for name, gpus in (("ours_1", 1), ("ours_N", n)):
        try:
            r = ours(os.path.join(out, name), warmup)
            res[name] = r["tokens_per_s_per_gpu"]
            eff = res[name] / res["ours_1"] if name == "ours_N" and "ours_1" in res else None
            print(f"| shardtrain | {gpus} | {r['tokens_per_s_per_gpu']:.0f} | {r['tflops']:.1f} | "
                  f"{r['peak_gib']:.1f} | {fmt(eff, '.1%')} |")
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"| shardtrain | {gpus} | (no result: {e}) | | | |")
    for name, gpus in (("torch_1", 1), ("torch_N", n)):
        js = [j for j in json_lines(os.path.join(out, name + ".log")) if "tokens_per_s_per_gpu" in j]
        if not js:
            print(f"| torch FSDP2 | {gpus} | (no result) | | | |")
            continue
        j = js[-1]
        res[name] = j["tokens_per_s_per_gpu"]
        eff = res[name] / res["torch_1"] if name == "torch_N" and "torch_1" in res else None
        print(f"| torch FSDP2 | {gpus} | {j['tokens_per_s_per_gpu']:.0f} | {j['model_tflops_per_gpu']:.1f} | "
              f"{j['peak_mem_gib']:.1f} | {fmt(eff, '.1%')} |")
    for a, b, label in (("ours_1", "torch_1", "1 GPU"), ("ours_N", "torch_N", f"{n} GPUs")):
        if a in res and b in res:
            print(f"\nOur ratio over torch on {label}: **{res[a] / res[b]:.3f}x**", end="")
    print("\n")


def parity(out, n):
    print(f"### Loss parity: tiny model, 50 steps, 1 GPU (grad_accum {n}) vs {n} GPUs\n")
    one, many = steps(os.path.join(out, "parity_1")), steps(os.path.join(out, "parity_N"))
    if not one or len(one) != len(many):
        print(f"(no comparison: {len(one)} and {len(many)} steps logged)\n")
        return
    rel = [abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, many)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print(f"- steps compared: {len(rel)}; loss {one[0]['loss']:.4f} -> {one[-1]['loss']:.4f} (1 GPU), "
          f"{many[0]['loss']:.4f} -> {many[-1]['loss']:.4f} ({n} GPUs)")
    print(f"- largest relative difference: {rel[worst]:.2e} at step {one[worst]['step']}; "
          f"mean {sum(rel) / len(rel):.2e}\n")


def transports(out, n):
    print(f"### Transports on {n} GPUs\n")
    print("| setting | NCCL paths (rank 0) | expect nvlink | all_gather busbw GB/s | reduce_scatter busbw GB/s "
          "| all_reduce busbw GB/s | training tokens/s per GPU |")
    print("|---|---|---|---:|---:|---:|---:|")
    for mode, label in (("p2p", "default (P2P/NVLink)"), ("shm", "NCCL_P2P_DISABLE=1"),
                        ("socket", "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1")):
        check = json_lines(os.path.join(out, f"check_{mode}.log"))
        sweep = json_lines(os.path.join(out, f"sweep_{mode}.log"))
        rc = exit_status(os.path.join(out, f"check_{mode}.log"))
        report = next((j["transport_report"] for j in check + sweep if "transport_report" in j), None)
        paths = "-"
        if report and report.get("ranks"):
            r0 = report["ranks"][0]
            kinds = sorted({f"{p.get('kind', '?')}" + (f" via {p['via']}" if p.get("via") else "")
                            for p in r0.get("paths", [])})
            paths = ", ".join(kinds) or "none (" + ", ".join(r0.get("networks", [])) + ")"
        verdict = "-" if rc is None else ("passed" if rc == 0 else f"failed (exit {rc})")
        bus = {}
        for j in sweep:
            for row in j.get("results", []):
                if row["bytes"] >= bus.get(row["op"], (0, 0))[0]:
                    bus[row["op"]] = (row["bytes"], row["busbw_gbps"])
        try:
            t = ours(os.path.join(out, f"train_{mode}"), 3)["tokens_per_s_per_gpu"]
        except (OSError, ValueError, KeyError, IndexError):
            t = None
        cells = [fmt(bus.get(op, (0, None))[1], ".1f") for op in ("all_gather", "reduce_scatter", "all_reduce")]
        print(f"| {label} | {paths} | {verdict} | {' | '.join(cells)} | {fmt(t, '.0f')} |")
    print("\nBus bandwidth at the largest size of the sweep; NCCL logs under nccl_<setting>/.\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    try:
        n = int(open(os.path.join(a.out, "ngpu.txt")).read())
    except (OSError, ValueError):
        n = 0
    if glob.glob(os.path.join(a.out, "ours_*")):
        scaling(a.out, n, a.warmup)
    if glob.glob(os.path.join(a.out, "parity_*")):
        parity(a.out, n)
    if glob.glob(os.path.join(a.out, "check_*")):
        transports(a.out, n)


if __name__ == "__main__":
    main()
