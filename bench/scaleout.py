#!/usr/bin/env python3
"""The bookkeeping of bench/scaleout.sh (standard library only):
  record DIR key=value...   one timed run's record.json: median step_s and tokens/s over
                            the steps after the first 2 (rank 0's metrics.jsonl), each
                            node's interface bytes per step, metrics' comm_* fields if any,
                            the prediction if predict.json is there
  fault DIR key=value...    one fault run's record.json: exit codes, messages, the verdict
  assemble OUT              OUT/scaleout.json from header.json and the records in run
                            order, and the table on stdout
  check OUT                 the quick variant's functional checks; exit 1 when one fails
  tcp-recv PORT / tcp-send ADDR PORT SECONDS
                            one TCP flow's rate (Mbit/s, printed by the sender): what the
                            shaped link gives a single stream, the sender timing to the
                            receiver's acknowledgement of the last byte
Bytes per step are the counter difference over the whole process lifetime (set-up and
rendezvous included) divided by the steps run, so they are slightly above what the
steps alone move."""
import json
import os
import re
import socket
import statistics
import sys
import time

SKIP = 2  # steps not timed: the first gathers allocate, caches are cold


def kv(args):
    out = {}
    for a in args:
        k, _, v = a.partition("=")
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = None if v in ("", "none") else v
    return out


def steps(d):
    recs = []
    try:
        for line in open(os.path.join(d, "metrics.jsonl")):
            line = line.strip()
            if line:
                r = json.loads(line)
                if isinstance(r, dict) and "step" in r and "step_s" in r:
                    recs.append(r)
    except (OSError, ValueError):
        pass
    by = {r["step"]: r for r in recs}  # a resumed run's later record wins
    return [by[s] for s in sorted(by)]


def counters(d):
    """Per node (tx, rx) bytes over the run, None where a node's namespace was gone."""
    def read(name):
        try:
            return [l.split() for l in open(os.path.join(d, name)) if l.strip()]
        except OSError:
            return []
    out = []
    for b, a in zip(read("counters_before"), read("counters_after")):
        try:
            out.append((int(a[0]) - int(b[0]), int(a[1]) - int(b[1])))
        except (ValueError, IndexError):
            out.append((None, None))
    return out


def rcs(d):
    out, i = [], 0
    while os.path.exists(os.path.join(d, f"node{i}.log")):
        try:
            out.append(int(open(os.path.join(d, f"node{i}.rc")).read()))
        except (OSError, ValueError):
            out.append(None)
        i += 1
    return out


def median(xs):
    return statistics.median(xs) if xs else None


def find_number(obj, keys):
    """The first of keys whose value is a number, top level first, then one level down."""
    if not isinstance(obj, dict):
        return None
    for k in keys:
        if isinstance(obj.get(k), (int, float)) and not isinstance(obj.get(k), bool):
            return float(obj[k])
    for v in obj.values():
        if isinstance(v, dict):
            x = find_number(v, keys)
            if x is not None:
                return x
    return None


def comm_fields(timed, ranks_per_node, tx_per_step):
    """Medians of the metrics' comm_* fields, and the bytes they say a node sends over
    the inter-node link per step (rank 0's figure x ranks per node) against the counter."""
    keys = sorted({k for r in timed for k in r if k.startswith("comm_")})
    if not keys:
        return None, None, None
    med = {}
    for k in keys:
        vals = [r[k] for r in timed if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        # a number: the median over the timed steps; anything else: the last step's value
        med[k] = median(vals) if vals else next((r[k] for r in reversed(timed) if k in r), None)
    byte_keys = [k for k in keys if "bytes" in k and isinstance(med.get(k), (int, float))]
    sent = [k for k in byte_keys if re.search(r"sent|send|tx|out", k)]
    inter = [k for k in sent if "inter" in k] or [k for k in byte_keys if "inter" in k] or sent
    inter = [k for k in inter if "intra" not in k]
    if not inter:
        return med, None, None
    per_node = sum(med[k] for k in inter) * ranks_per_node
    agree = per_node / tx_per_step if tx_per_step else None
    return med, per_node, agree


def cmd_record(d, a):
    recs = steps(d)
    timed = [r for r in recs if r["step"] > SKIP]
    c = counters(d)
    n = len(recs)
    tx = [None if t is None or not n else round(t / n) for t, _ in c]
    rx = [None if r is None or not n else round(r / n) for _, r in c]
    rec = dict(a)
    rec["link_mbit"] = a.get("link_mbit") or None
    rec["overlap"] = a.get("overlap", "off") == "on"
    rec["delay_ms"] = a.get("delay_ms") or 0
    rec["steps_done"] = n
    rec["node_exit_codes"] = rcs(d)
    rec["ok"] = bool(rec["node_exit_codes"]) and all(x == 0 for x in rec["node_exit_codes"]) and n == a["steps"]
    rec["step_s"] = median([r["step_s"] for r in timed])
    rec["step_s_min"] = min((r["step_s"] for r in timed), default=None)
    rec["step_s_max"] = max((r["step_s"] for r in timed), default=None)
    rec["tokens_per_s"] = median([r["tokens_per_s"] for r in timed if "tokens_per_s" in r])
    rec["tokens_per_step"] = (round(rec["tokens_per_s"] * rec["step_s"]) if rec["tokens_per_s"] and rec["step_s"]
                              else None)
    rec["final_loss"] = recs[-1].get("loss") if recs else None
    rec["tx_bytes_per_step"] = tx
    rec["rx_bytes_per_step"] = rx
    med, per_node, agree = comm_fields(timed, a["ranks_per_node"], tx[0] if tx else None)
    rec["comm_metrics"] = med
    rec["comm_inter_tx_bytes_per_step"] = per_node
    rec["comm_vs_counter"] = agree
    # The communication the step waited for (rank 0's comm_blocked_s: with the comm
    # thread, the waits for collectives still running; without it, every collective),
    # and what is left of the step: its compute (predict's --compute-s).
    blocked = median([r["comm_blocked_s"] for r in timed if isinstance(r.get("comm_blocked_s"), (int, float))])
    rec["exposed_comm_s"] = blocked
    rec["compute_s"] = (round(rec["step_s"] - blocked, 4) if rec["step_s"] is not None and blocked is not None
                        else None)
    try:
        pred = json.load(open(os.path.join(d, "predict.json")))
        rec["predicted_step_s"] = find_number(pred, ("predicted_step_s", "step_s", "predicted_s", "total_s"))
        rec["predicted_inter_bytes_per_node"] = find_number(pred, ("inter_node_bytes_per_node",))
        pb = rec["predicted_inter_bytes_per_node"]
        rec["predicted_bytes_vs_counter"] = pb / tx[0] if pb and tx and tx[0] else None
        rec["predict"] = pred
    except (OSError, ValueError):
        rec["predicted_step_s"] = None
        rec["predicted_inter_bytes_per_node"] = None
        rec["predicted_bytes_vs_counter"] = None
    try:
        rec["openblas_threads"] = int(open(os.path.join(d, "openblas_threads")).read())
    except (OSError, ValueError):
        pass
    try:
        flow = open(os.path.join(d, "tcp_mbit")).read().split()
        rec["tcp_one_flow_mbit"] = float(flow[0])
        rec["host_net_ns_per_byte"] = float(flow[1]) if len(flow) > 1 else None
    except (OSError, ValueError, IndexError):
        rec["tcp_one_flow_mbit"] = None
        rec["host_net_ns_per_byte"] = None
    rec["dir"] = d
    json.dump(rec, open(os.path.join(d, "record.json"), "w"), indent=1)


def error_lines(path):
    out = []
    try:
        for line in open(path, errors="replace"):
            if re.search(r"error|failed|timed out|launch: rank", line, re.I):
                out.append(line.rstrip()[:400])
    except OSError:
        pass
    return out


def names_node1(lines):
    """Whether a message names the lost node: its rank (1), its address or its node."""
    return any(re.search(r"\brank 1\b|\branks 1\b|198\.18\.0\.2\b|\bnode 1\b|node-rank 1\b", l) for l in lines)


def cmd_fault(d, a):
    recs = steps(d)
    rec = dict(a)
    rec["fault"] = a["kind"]
    rec["nodes"], rec["ranks_per_node"], rec["strategy"], rec["link_mbit"] = 2, 1, "fsdp", None
    rec["steps_done"] = len(recs)
    rec["node_exit_codes"] = rcs(d)
    slow = max(recs, key=lambda r: r["step_s"]) if recs else None
    rec["slowest_step"] = slow["step"] if slow else None
    rec["slowest_step_s"] = slow["step_s"] if slow else None
    rec["step_s"] = median([r["step_s"] for r in recs if r["step"] > SKIP])
    rec["messages"] = {f"node{i}": error_lines(os.path.join(d, f"node{i}.log"))[-6:]
                       for i in range(len(rec["node_exit_codes"]))}
    node0 = rec["messages"].get("node0", [])
    codes = rec["node_exit_codes"]
    tmo = a["timeout_s"]
    # functional_ok: what .ci/run checks (the run ends: it finishes, or the survivors fail
    # with a distributed error instead of hanging); meets_goal: the stricter promise
    # (recover, or exit within dist.timeout_s with a message naming the lost node)
    if a["kind"] == "linkdown":
        finished = codes == [0, 0] and rec["steps_done"] == a["steps"]
        failed = any(x not in (0, None) for x in codes)
        rec["names_lost_node"] = names_node1(node0)
        rec["functional_ok"] = finished or (failed and 4 in codes)
        rec["meets_goal"] = finished or (failed and rec["names_lost_node"])
        if finished:
            rec["outcome"] = ("recovered: all %d steps done, the slowest step %.1f s (step %s; median %.2f s)"
                              % (a["steps"], rec["slowest_step_s"], rec["slowest_step"], rec["step_s"] or 0))
        else:
            rec["outcome"] = ("failed (exit codes %s) after %d of %d steps%s"
                              % (codes, rec["steps_done"], a["steps"],
                                 ", naming node 1" if rec["names_lost_node"] else ", no message names node 1"))
    else:
        for key in ("exit_after_s", "error_after_s"):
            try:
                rec[key] = float(open(os.path.join(d, key)).read())
            except (OSError, ValueError):
                rec[key] = None
        rc0 = codes[0] if codes else None
        rec["survivor_exit_code"] = rc0
        rec["names_lost_node"] = names_node1(node0)
        after = rec["exit_after_s"]
        rec["within_timeout"] = after is not None and after <= tmo + 2
        # a collective that began just before the loss may wait a whole timeout after it
        rec["functional_ok"] = rc0 not in (0, None) and after is not None and after <= 2 * tmo + 15
        rec["meets_goal"] = rc0 not in (0, None) and rec["within_timeout"] and rec["names_lost_node"]
        rec["outcome"] = ("node 0 exited %s, its error %s s and its exit %s s after the loss (dist.timeout_s %s)%s"
                          % (rc0, rec["error_after_s"], after, tmo,
                             "" if rec["names_lost_node"] else "; no message names node 1"))
    rec["expected"] = rec["meets_goal"]
    rec["dir"] = d
    json.dump(rec, open(os.path.join(d, "record.json"), "w"), indent=1)


def mb(x):
    return "-" if x is None else f"{x / 1e6:.1f}"


def f(x, spec):
    return "-" if x is None else format(x, spec)


def table(doc):
    m = doc["machine"]
    print(f"\nscaleout: {doc['date']}, commit {doc['commit']}, {m['nproc']} cores, kernel {m['kernel']}, "
          f"load average {' '.join(m['loadavg_start'])} at the start, {' '.join(m.get('loadavg_end') or [])} "
          f"at the end; netem {'available' if m['netem_available'] else 'missing'}\n")
    print("| nodes x ranks | strategy | overlap | link | one TCP flow Mbit/s | steps | step s (median) | steps/s | "
          "tokens/s | exposed comm s | tx MB/step per node | rx MB/step per node | comm_ MB/step | predicted s | "
          "pred/meas |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for r in doc["runs"]:
        link = "no limit" if not r["link_mbit"] else f"{r['link_mbit']} Mbit/s"
        if r.get("delay_ms"):
            link += f" + {r['delay_ms']} ms"
        ratio = r["predicted_step_s"] / r["step_s"] if r.get("predicted_step_s") and r["step_s"] else None
        print(f"| {r['nodes']} x {r['ranks_per_node']} | {r['strategy']} | {'on' if r.get('overlap') else 'off'} | {link} | "
              f"{f(r.get('tcp_one_flow_mbit'), '.0f')} | {r['steps_done']}/{r['steps']} | "
              f"{f(r['step_s'], '.3f')} | {f(1 / r['step_s'] if r['step_s'] else None, '.3f')} | "
              f"{f(r['tokens_per_s'], '.0f')} | {f(r.get('exposed_comm_s'), '.3f')} | "
              f"{' / '.join(mb(x) for x in r['tx_bytes_per_step'])} | "
              f"{' / '.join(mb(x) for x in r['rx_bytes_per_step'])} | {mb(r.get('comm_inter_tx_bytes_per_step'))} | "
              f"{f(r.get('predicted_step_s'), '.3f')} | {f(ratio, '.3f')} |")
    if doc["faults"]:
        print("\n| fault | exit codes (node 0, node 1) | steps done | outcome | meets the goal | node 0's error |")
        print("|---|---|---:|---|---|---|")
        for r in doc["faults"]:
            errs = [m for m in r["messages"].get("node0") or [] if "error:" in m] or [""]
            msg = errs[0].replace("|", "\\|")
            print(f"| {r['fault']} | {r['node_exit_codes']} | {r['steps_done']}/{r['steps']} | {r['outcome']} | "
                  f"{'yes' if r['meets_goal'] else 'no'} | {msg} |")
    print()


def cmd_assemble(out):
    doc = json.load(open(os.path.join(out, "header.json")))
    try:  # written by scaleout.sh when its last run ended
        doc["machine"]["loadavg_end"] = open(os.path.join(out, "loadavg_end")).read().split()[:3]
    except OSError:
        doc["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    doc["runs"], doc["faults"] = [], []
    for name in open(os.path.join(out, "runs.order")).read().split():
        try:
            r = json.load(open(os.path.join(out, "runs", name, "record.json")))
        except (OSError, ValueError):
            continue
        r["name"] = name
        (doc["faults"] if "fault" in r else doc["runs"]).append(r)
        if "params" not in doc:
            try:
                m = re.search(r"\| ([0-9.]+[KMB]) params", open(os.path.join(out, "runs", name, "node0.log")).read())
                if m:
                    doc["params"] = m.group(1)
            except OSError:
                pass
    tmp = os.path.join(out, "scaleout.json.tmp")
    json.dump(doc, open(tmp, "w"), indent=1)
    os.replace(tmp, os.path.join(out, "scaleout.json"))
    table(doc)


def cmd_check(out):
    doc = json.load(open(os.path.join(out, "scaleout.json")))
    bad = []
    for r in doc["runs"]:
        if not r["ok"]:
            bad.append(f"{r['name']}: did not finish (exit codes {r['node_exit_codes']}, "
                       f"{r['steps_done']} of {r['steps']} steps)")
        if not all(x and x > 0 for x in r["tx_bytes_per_step"] + r["rx_bytes_per_step"]):
            bad.append(f"{r['name']}: an interface counted no bytes ({r['tx_bytes_per_step']}, {r['rx_bytes_per_step']})")
    groups = {}
    for r in doc["runs"]:
        if r["ok"] and r["step_s"] and not r.get("delay_ms"):
            groups.setdefault((r["nodes"], r["ranks_per_node"], r["strategy"], r.get("overlap")), []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: -(r["link_mbit"] or float("inf")))
        for fast, slow in zip(g, g[1:]):
            if not slow["step_s"] > fast["step_s"]:
                bad.append(f"{slow['name']}: not slower than {fast['name']} ({slow['step_s']:.3f} s against "
                           f"{fast['step_s']:.3f} s)")
    notes = []
    for r in doc["faults"]:
        if not r["functional_ok"]:
            bad.append(f"{r['name']}: {r['outcome']}")
        elif not r["meets_goal"]:
            notes.append(f"{r['name']}: {r['outcome']}")
    if not doc["runs"]:
        bad.append("no runs")
    for n in notes:
        print(f"scaleout: note (not a failure): the fault ended the run, but not within dist.timeout_s naming the "
              f"lost node: {n}")
    for b in bad:
        print(f"scaleout: check failed: {b}")
    if not bad:
        print(f"scaleout: check passed: {len(doc['runs'])} runs finished and moved bytes, slower links gave slower "
              f"steps, {len(doc['faults'])} fault(s) ended the run as they should")
    return 1 if bad else 0


def tcp_recv(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(30)
    conn, _ = srv.accept()
    conn.settimeout(60)
    while conn.recv(1 << 20):
        pass
    conn.sendall(b"k")
    conn.close()


def busy_jiffies():
    """CPU time the machine spent busy: user, system, irq and softirq, all cores (not
    nice: other work at low priority is left out), in clock ticks."""
    f = open("/proc/stat").readline().split()
    return int(f[1]) + int(f[3]) + int(f[6]) + int(f[7])


def tcp_send(addr, port, seconds):
    deadline = time.time() + 10
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=10)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    buf = b"\0" * (1 << 20)
    busy0 = busy_jiffies()
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s.sendall(buf)
        sent += len(buf)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(60)
    s.recv(1)
    dt = time.perf_counter() - t0
    busy = (busy_jiffies() - busy0) / os.sysconf("SC_CLK_TCK")
    # The rate, and the CPU the whole path took per byte: sender, receiver and the
    # emulated switch together (what the step model's host_net_ns_per_byte is).
    print(f"{sent * 8 / dt / 1e6:.1f} {busy / sent * 1e9:.2f}")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    cmd, target = sys.argv[1], sys.argv[2]
    if cmd == "tcp-recv":
        tcp_recv(int(target))
    elif cmd == "tcp-send":
        tcp_send(target, int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "record":
        cmd_record(target, kv(sys.argv[3:]))
    elif cmd == "fault":
        cmd_fault(target, kv(sys.argv[3:]))
    elif cmd == "assemble":
        cmd_assemble(target)
    elif cmd == "check":
        return cmd_check(target)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
