#!/usr/bin/env python3
"""Starts one `shardtrain launch` per GPU worker node of a Ray cluster; a KubeRay RayJob
runs it on the Ray head:

    ray_driver.py --nnodes 2 --nproc-per-node 4 -- train --config /etc/shardtrain/config.toml

1. Connects to the running cluster (`ray.init(address="auto")`) and waits up to --wait-s
   for --nnodes alive nodes that each advertise at least --nproc-per-node GPUs, printing
   "waiting for N nodes with G GPUs: k ready" every 5 s.
2. Reserves one bundle of {"GPU": G[, "CPU": C]} per node in a STRICT_SPREAD placement
   group (one bundle per node) and waits for it, within the same deadline.
3. Asks each bundle's node for its IP; bundle 0's becomes the master address.
4. Runs one task per bundle (num_gpus=G, never retried). Task i runs
       <binary> launch --nproc-per-node G --nnodes N --node-rank i
                --master-addr <bundle 0's IP> --master-port P -- <arguments after -->
   in --workdir (default /workspace, the pod's output volume: the run's runs/... go there)
   and prints its output (stdout and stderr) line by line as "[node i] ...". Ray sets
   CUDA_VISIBLE_DEVICES for a task with num_gpus, and shardtrain respects it. The head is
   started with num-gpus 0, so the tasks land on the workers.
5. Collects the exit codes as the tasks end; after the first failure the other tasks are
   cancelled (their `launch` gets SIGTERM, which it forwards to its ranks). Prints one line
   naming every failing node and exits 0 when every node did, else with the code of the
   first node that failed (1 when that is not a code in 1..255, e.g. a signal).

Bad options exit 2; no nodes or placement within --wait-s exits 1.
Only the standard library is imported at module level: Ray is imported in main() alone,
so the logic below it (parse_args, node_command, ready_nodes, bundles, summarize,
prefix_line, run_command) runs and is tested without Ray.
"""
import argparse
import ipaddress
import math
import subprocess
import sys
import time

POLL_S = 5.0
STOP_GRACE_S = 30.0


def _parser():
    p = argparse.ArgumentParser(
        prog="ray_driver.py", allow_abbrev=False,
        usage="%(prog)s --nnodes N --nproc-per-node G [options] -- <shardtrain arguments...>",
        description="Start one `shardtrain launch` per GPU node of the Ray cluster this runs in.",
        epilog="example: %(prog)s --nnodes 2 --nproc-per-node 4 -- train --config /etc/shardtrain/config.toml")
    p.add_argument("--nnodes", type=int, required=True, metavar="N", help="GPU nodes in the job, one `launch` on each")
    p.add_argument("--nproc-per-node", type=int, required=True, metavar="G", help="ranks (GPUs) per node")
    p.add_argument("--master-port", type=int, default=29500, metavar="P", help="rendezvous port on node 0 (default 29500)")
    p.add_argument("--binary", default="shardtrain", metavar="PATH", help="shardtrain executable on the nodes (default shardtrain)")
    p.add_argument("--wait-s", type=float, default=600.0, metavar="S",
                   help="seconds to wait for the nodes and the placement group (default 600)")
    p.add_argument("--cpus-per-node", type=int, default=None, metavar="C",
                   help="CPUs to reserve per node beside the GPUs (default none)")
    p.add_argument("--workdir", default="/workspace", metavar="DIR",
                   help="absolute directory each node's `launch` runs in, where the run writes runs/... "
                        "(default /workspace, the worker pod's output volume)")
    return p


def parse_args(argv):
    """Options before `--`, shardtrain's arguments after it (in .args). Exits 2 on an error."""
    argv = list(argv)
    p = _parser()
    if "--" in argv:
        cut = argv.index("--")
        own, rest = argv[:cut], argv[cut + 1:]
    else:
        own, rest = argv, []
    opts = p.parse_args(own)  # exits 2 on an unknown option, a missing one or a bad number
    if opts.nnodes < 1:
        p.error(f"--nnodes must be at least 1, not {opts.nnodes}")
    if opts.nproc_per_node < 1:
        p.error(f"--nproc-per-node must be at least 1, not {opts.nproc_per_node}")
    if not 1 <= opts.master_port <= 65535:
        p.error(f"--master-port must be in 1..65535, not {opts.master_port}")
    if not opts.binary:
        p.error("--binary must not be empty")
    if not (math.isfinite(opts.wait_s) and opts.wait_s >= 0):
        p.error(f"--wait-s must be a number of seconds, 0 or more, not {opts.wait_s}")
    if opts.cpus_per_node is not None and opts.cpus_per_node < 0:
        p.error(f"--cpus-per-node must be 0 or more, not {opts.cpus_per_node}")
    if not opts.workdir.startswith("/"):
        p.error(f"--workdir must be an absolute directory, not {opts.workdir!r}")
    if not rest:
        p.error("no shardtrain arguments: give them after `--`, e.g. "
                "-- train --config /etc/shardtrain/config.toml")
    opts.args = rest
    return opts


def node_command(binary, nnodes, nproc, node_rank, master_addr, master_port, args):
    """The argv that node `node_rank` runs: `<binary> launch ... -- <args>`, all strings."""
    return [str(binary), "launch",
            "--nproc-per-node", str(nproc),
            "--nnodes", str(nnodes),
            "--node-rank", str(node_rank),
            "--master-addr", str(master_addr),
            "--master-port", str(master_port),
            "--", *map(str, args)]


def _address_key(address):
    try:
        ip = ipaddress.ip_address(address)
        return (0, ip.version, int(ip), "")
    except ValueError:
        return (1, 0, 0, str(address))


def ready_nodes(nodes, nproc):
    """The nodes (dicts as ray.nodes() gives them) that are alive and advertise at least
    `nproc` GPUs, sorted by NodeManagerAddress (IPs numerically)."""
    fit = [n for n in nodes
           if n.get("Alive") and (n.get("Resources") or {}).get("GPU", 0) >= nproc]
    return sorted(fit, key=lambda n: _address_key(n.get("NodeManagerAddress", "")))


def bundles(nnodes, nproc, cpus=None):
    """Placement-group bundles: one {"GPU": nproc, "CPU": cpus} per node; no CPU key for 0/None."""
    b = {"GPU": nproc}
    if cpus:
        b["CPU"] = cpus
    return [dict(b) for _ in range(nnodes)]


def _is_int(code):
    return isinstance(code, int) and not isinstance(code, bool)


def _exit_text(code):
    if _is_int(code):
        if code < 0:
            return f"exit code {code} (signal {-code})"
        return f"exit code {code}"
    return "no exit code" if code is None else str(code)


def summarize(results):
    """results: (node_rank, address, exit_code) in the order the nodes ended. Returns the
    driver's exit code (0 when every code is 0, else the first failing node's code, or 1 when
    that is not an int in 1..255) and a one-line message naming every failing node."""
    results = list(results)
    if not results:
        return 1, "no node reported an exit code"
    failed = [r for r in results if not (_is_int(r[2]) and r[2] == 0)]
    if not failed:
        return 0, f"all {len(results)} nodes exited 0"
    first = failed[0][2]
    code = first if _is_int(first) and 1 <= first <= 255 else 1
    parts = "; ".join(f"node {rank} ({addr}): {_exit_text(c)}" for rank, addr, c in failed)
    return code, f"{len(failed)} of {len(results)} nodes failed: {parts}"


def prefix_line(node_rank, line):
    """One line of node `node_rank`'s output as "[node i] line" (its line ending dropped)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.rstrip("\r\n")
    return f"[node {node_rank}] {line}"


def run_command(node_rank, argv, out=None, cwd=None):
    """Runs argv (in directory cwd when given), printing its stdout and stderr line by line through prefix_line to `out`
    (stdout by default); returns its exit code (127 when it cannot be started). An exception
    while it runs (a cancelled Ray task gets KeyboardInterrupt) stops it with SIGTERM, then
    SIGKILL after STOP_GRACE_S."""
    out = out or sys.stdout
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1, cwd=cwd)
    except OSError as e:
        print(prefix_line(node_rank, f"cannot start {argv[0]}: {e}"), file=out, flush=True)
        return 127
    try:
        for line in proc.stdout:
            print(prefix_line(node_rank, line), file=out, flush=True)
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def _describe(nodes):
    alive = [n for n in nodes if n.get("Alive")]
    return ", ".join(f"{n.get('NodeManagerAddress')} ({(n.get('Resources') or {}).get('GPU', 0):g} GPUs)"
                     for n in alive) or "none"


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    n, g = opts.nnodes, opts.nproc_per_node

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address="auto")
    deadline = time.monotonic() + opts.wait_s
    while True:
        nodes = ray.nodes()
        k = len(ready_nodes(nodes, g))
        print(f"waiting for {n} nodes with {g} GPUs: {k} ready", flush=True)
        if k >= n:
            break
        if time.monotonic() + POLL_S > deadline:
            print(f"ray_driver: gave up after {opts.wait_s:g} s: {k} of {n} nodes with {g} GPUs ready; "
                  f"alive nodes: {_describe(nodes)}", file=sys.stderr)
            return 1
        time.sleep(POLL_S)

    pg = placement_group(bundles(n, g, opts.cpus_per_node), strategy="STRICT_SPREAD")
    done, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
    if not done:
        remove_placement_group(pg)
        print(f"ray_driver: placement group of {n} bundles {bundles(1, g, opts.cpus_per_node)[0]} "
              f"(one per node) not ready within {opts.wait_s:g} s", file=sys.stderr)
        return 1

    def on(i):
        return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)

    @ray.remote(num_cpus=0)
    def node_ip():
        import ray.util
        return ray.util.get_node_ip_address()

    @ray.remote(num_gpus=g, num_cpus=opts.cpus_per_node or 0, max_retries=0)
    def run_node(i, argv, workdir):
        # Not the Ray worker's own directory: the run's files go to the pod's volume.
        return run_command(i, argv, cwd=workdir)

    addrs = ray.get([node_ip.options(scheduling_strategy=on(i)).remote() for i in range(n)])
    print(f"master {addrs[0]}:{opts.master_port}; nodes: {', '.join(addrs)}", flush=True)
    pending = {run_node.options(scheduling_strategy=on(i)).remote(
        i, node_command(opts.binary, n, g, i, addrs[0], opts.master_port, opts.args), opts.workdir): i
        for i in range(n)}
    results, stopping = [], False
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(ready[0])
        try:
            code = ray.get(ready[0])
        except ray.exceptions.TaskCancelledError:
            code = "cancelled"
        except ray.exceptions.RayError as e:
            code = f"task error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        results.append((i, addrs[i], code))
        if code != 0 and not stopping:
            stopping = True
            for ref in pending:
                ray.cancel(ref)
    code, message = summarize(results)
    print(f"ray_driver: {message}", flush=True)
    remove_placement_group(pg)
    return code


if __name__ == "__main__":
    sys.exit(main())
