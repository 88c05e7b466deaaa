#!/usr/bin/env python3
"""How much of the communication ran at the same time as compute, from a Nsight Systems
trace of a shardtrain run.

  nsys profile -t cuda -o trace shardtrain launch --nproc-per-node N -- train ...
  nsys stats --report cuda_gpu_trace --format csv --output trace trace.nsys-rep
  bench/overlap.py trace_cuda_gpu_trace.csv [--skip-s 0]

Communication = every kernel and copy on a stream that runs an NCCL kernel (each NCCL
communicator has a stream of its own); compute = everything on the other streams of
the same device. Prints one JSON line per device: communication time, the part of it
during which compute was running, that fraction, and the streams it counted.
"""
import argparse
import csv
import json
import sys
from collections import defaultdict


def column(header, *names):
    for n in names:
        for i, h in enumerate(header):
            if h.strip().lower().startswith(n.lower()):
                return i
    sys.exit(f"overlap.py: no column {names} in {header}")


def merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(a, b, merged):
    """Length of [a, b) covered by the sorted disjoint intervals `merged`."""
    total = 0
    for x, y in merged:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--skip-s", type=float, default=0.0, help="ignore the first seconds of GPU activity")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    c_start = column(header, "Start")
    c_dur = column(header, "Duration")
    c_strm = column(header, "Strm", "Stream")
    c_dev = column(header, "Device")
    c_name = column(header, "Name")
    ops = []
    for r in rows:
        try:
            s, d = float(r[c_start]), float(r[c_dur])
        except (ValueError, IndexError):
            continue
        ops.append((r[c_dev], r[c_strm], s, s + d, r[c_name]))
    if not ops:
        sys.exit("overlap.py: no GPU activity in the trace")
    t0 = min(o[2] for o in ops) + args.skip_s * 1e9
    by_dev = defaultdict(list)
    for o in ops:
        if o[2] >= t0:
            by_dev[o[0]].append(o)
    for dev, dops in sorted(by_dev.items()):
        comm_streams = {o[1] for o in dops if "nccl" in o[4].lower()}
        comm = [(o[2], o[3]) for o in dops if o[1] in comm_streams]
        compute = merge([(o[2], o[3]) for o in dops if o[1] not in comm_streams])
        comm_m = merge(comm)
        comm_ns = sum(b - a for a, b in comm_m)
        overlap_ns = sum(covered(a, b, compute) for a, b in comm_m)
        span = max(o[3] for o in dops) - min(o[2] for o in dops)
        print(json.dumps({
            "device": dev,
            "comm_streams": sorted(comm_streams),
            "comm_ops": len(comm),
            "comm_ms": round(comm_ns / 1e6, 3),
            "overlapped_ms": round(overlap_ns / 1e6, 3),
            "overlapped_fraction": round(overlap_ns / comm_ns, 4) if comm_ns else None,
            "compute_busy_fraction": round(sum(b - a for a, b in compute) / span, 4) if span else None,
            "span_ms": round(span / 1e6, 3),
        }))


if __name__ == "__main__":
    main()
