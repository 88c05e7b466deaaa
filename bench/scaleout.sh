#!/usr/bin/env bash
# An emulated cluster on one machine: K "nodes" as network namespaces, each joined to
# a bridge (in a namespace of its own) by a veth pair whose two ends are shaped with
# tc tbf, so a node's link is rate-limited in both directions. Each node runs
# `shardtrain launch --nnodes K --node-rank i` on the CPU backend, Gloo over the
# node's interface, with random data and a custom ~20M-parameter model. The sweep
# times every (shape, strategy, link) and reads the bytes each node moved from the
# kernel's interface counters; then the faults: a node's link taken down for 5 s
# mid-run, a node lost (its link cut, its processes killed, its namespace deleted).
#
# Promises: addresses come from 198.18.0.0/15 and exist only inside the namespaces;
# the host's own interfaces, routes and qdiscs are not touched; every namespace,
# link and process the run made is removed at exit, on failure and on Ctrl-C too
# (the names carry this script's pid, so a run that was killed outright is cleaned
# up by the next one, with a message). Output: OUT/scaleout.json, a table on stdout,
# and per run OUT/runs/<name>/ (each node's log, rank 0's metrics.jsonl).
#
# --quick is the functional check .ci/run uses: it exits non-zero only when a run does
# not finish, moves no bytes, is not slower on the slower link, or a fault does not
# behave as expected; timings are never compared with thresholds (the machine is
# shared and noisy). The full sweep is a benchmark, not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=bench

usage() {
  cat <<'EOF'
Usage: bench/scaleout.sh [OPTIONS] OUT
  (root; needs ip and tc from iproute2, and python3)

Sweeps link rate x strategy (FSDP full shard, HSDP) x shape over an emulated cluster
of network namespaces and writes OUT/scaleout.json, a table on stdout, and
OUT/scaleout.html with OUT/scaleout.svg (steps/s against link rate, measured and
predicted: shardtrain report --scaleout OUT).

  --quick            the CI variant: 2 nodes x 1 rank, FSDP, no limit and 200 Mbit/s,
                     one fault (node lost); under 3 minutes; exits 1 only on a
                     functional failure (a run did not finish, no bytes, the slower
                     link not slower, the fault not as expected)
  --full             shapes 2x1, 2x2 and 4x1 (more ranks than cores: see the note it prints)
  --nodes K          nodes, 2..4 (default 2); one shape K x P unless --full
  --ranks-per-node P ranks per node (default 1)
  --rates LIST       link rates in Mbit/s, 0 = no limit (default "0 1000 200 50");
                     "200@2" is 200 Mbit/s plus 2 ms delay (needs sch_netem; the
                     default list adds it when the kernel has netem)
  --overlap LIST     on and/or off (default "on off"): dist.overlap, the CPU backend's
                     communication thread (on: prefetched gathers and reduce-scatters
                     overlap compute; off: every collective runs inside its call)
  --strategies LIST  fsdp and/or hsdp (default "fsdp hsdp"); HSDP shards within a node
                     (dist.shard_group_size = ranks per node) and replicates across
                     nodes, so with 1 rank per node it is pure replication
  --faults LIST      any of linkdown (node 1's interface down for 5 s mid-run), nodekill
                     (node 1's processes killed, then its namespace deleted), nodelost
                     (its link cut first, so no connection is closed: a power loss), or
                     none (default "linkdown nodekill nodelost"); each on a 2 x 1 FSDP job,
                     no link limit, dist.timeout_s = --timeout-s
  --steps N          steps per run (default 8; 5 on links under 200 Mbit/s; the first
                     2 are not timed)
  --timeout-s S      dist.timeout_s of the fault runs (default 20)
  --bin PATH         the shardtrain binary (default build/shardtrain)
  --sysctl K=V       set a sysctl in every node's namespace (repeatable), e.g.
                     net.ipv4.tcp_slow_start_after_idle=0
  -h, --help         this text

Environment: SCALEOUT_MODEL overrides the model options (default
"--model.layers=4 --model.hidden_size=768 --model.intermediate_size=1536
 --model.heads=12 --model.kv_heads=4", 20.66M parameters, vocab 256).
EOF
}

QUICK=0 FULL=0 NODES=2 RPN=1 RATES="" STRATS="fsdp hsdp" FAULTS="linkdown nodekill nodelost" OVERLAPS="on off"
STEPS=8 SLOW_STEPS=5 FAULT_TIMEOUT=20 BIN=build/shardtrain OUT="" SYSCTLS=()
while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --quick) QUICK=1 ;;
    --full) FULL=1 ;;
    --nodes) NODES=$2; shift ;;
    --ranks-per-node) RPN=$2; shift ;;
    --rates) RATES=$2; shift ;;
    --strategies) STRATS=$2; shift ;;
    --overlap) OVERLAPS=$2; shift ;;
    --faults) FAULTS=$2; shift ;;
    --steps) STEPS=$2; SLOW_STEPS=$2; shift ;;
    --timeout-s) FAULT_TIMEOUT=$2; shift ;;
    --bin) BIN=$2; shift ;;
    --sysctl) SYSCTLS+=("$2"); shift ;;
    -*) echo "scaleout: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "scaleout: one OUT folder only (see --help)" >&2; exit 2; }; OUT=$1 ;;
  esac
  shift
done
die() { echo "scaleout: $*" >&2; exit 2; }
[ -n "$OUT" ] || { usage >&2; exit 2; }
[[ $NODES =~ ^[2-4]$ ]] || die "--nodes must be 2, 3 or 4"
[[ $RPN =~ ^[1-4]$ ]] || die "--ranks-per-node must be 1..4"
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 3)) || die "--steps must be at least 3 (2 are not timed)"
for o in $OVERLAPS; do [[ $o == on || $o == off ]] || die "--overlap takes on and/or off, not '$o'"; done
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
for c in ip tc python3; do command -v $c >/dev/null || die "needs $c (ip and tc: iproute2; scripts/setup.sh installs it)"; done
[ -x "$BIN" ] || die "no shardtrain binary at $BIN (build it: cmake --build build --target shardtrain)"
BIN=$(realpath "$BIN")

# Names: every namespace is stsb<pid>br (the bridge) or stsb<pid>n<i> (node i).
PFX="stsb$$"
BRNS="${PFX}br"
OWNED=()          # namespaces this run made, removed at exit (with every process inside)
ns_kill() {       # every process inside namespace $1: TERM, then KILL
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null) || return 0
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.2
    pids=$(ip netns pids "$1" 2>/dev/null)
    [ -n "$pids" ] || return 0
  done
  kill -KILL $pids 2>/dev/null
  sleep 0.2
}
ns_del() {
  ns_kill "$1"
  ip netns del "$1" 2>/dev/null
  local keep=() n
  for n in "${OWNED[@]}"; do [ "$n" = "$1" ] || keep+=("$n"); done
  OWNED=("${keep[@]}")
}
cleanup() {  # the launched processes all live inside the namespaces
  local n
  for n in "${OWNED[@]}"; do ns_kill "$n"; ip netns del "$n" 2>/dev/null; done
  OWNED=()
}
trap cleanup EXIT
trap 'echo "scaleout: interrupted; removing the namespaces" >&2; cleanup; trap - EXIT; exit 130' INT
trap 'echo "scaleout: terminated; removing the namespaces" >&2; cleanup; trap - EXIT; exit 143' TERM

# A killed run leaves its namespaces (and the links and processes inside); remove
# those whose owner is no longer a running scaleout.sh.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^stsb[0-9]+(br|n[0-9]+)$'); do
  owner=${ns#stsb}; owner=${owner%%[bn]*}
  if ! grep -qs scaleout.sh "/proc/$owner/cmdline"; then
    echo "scaleout: removing namespace $ns left by an earlier run (pid $owner, no longer running)"
    ns_kill "$ns"; ip netns del "$ns" 2>/dev/null
  fi
done

# Can this machine make namespaces, and does its kernel have sch_netem?
ip netns add "${PFX}n9" 2>/dev/null || die "'ip netns add' fails here (needs root in the initial network namespace)"
OWNED+=("${PFX}n9")
ip -n "${PFX}n9" link add pa type veth peer name pb || die "cannot make a veth pair"
ip -n "${PFX}n9" link add pc type bridge || die "cannot make a bridge"
NETEM=0
tc -n "${PFX}n9" qdisc add dev pa root netem delay 1ms 2>/dev/null && NETEM=1
ns_del "${PFX}n9"
if ((NETEM)); then echo "scaleout: sch_netem available: delay settings are run"
else echo "scaleout: this kernel has no sch_netem (tc netem fails): no delay, jitter or loss settings, rate limits only"; fi

if ((QUICK)); then
  SHAPES="2x1" STRATS="fsdp" FAULTS="nodelost" OVERLAPS="on"
  [ -n "$RATES" ] || RATES="0 200"
  STEPS=5 SLOW_STEPS=5
elif ((FULL)); then
  SHAPES="2x1 2x2 4x1"
else
  SHAPES="${NODES}x${RPN}"
fi
if [ -z "$RATES" ]; then RATES="0 1000 200 50"; ((NETEM)) && RATES+=" 200@2"; fi
[ "$FAULTS" = none ] && FAULTS=""

MODEL=(${SCALEOUT_MODEL:---model.layers=4 --model.hidden_size=768 --model.intermediate_size=1536 --model.heads=12 --model.kv_heads=4})
# One sequence of 64 tokens per rank and step: little compute (about 0.3 s on a free
# core), so the link decides the step time below 1 Gbit/s.
TRAIN=(--data.source=random --train.seq_len=64 --train.micro_batch=1 --train.log_every=1
       --run.progress=off --run.tensorboard=false --optim.warmup_steps=2)
NPROC=$(nproc)
mkdir -p "$OUT/runs" || die "cannot make $OUT"
OUT=$(realpath "$OUT")
: > "$OUT/runs.order"
T0=$(date +%s)
stamp() { echo "scaleout: [$(($(date +%s) - T0)) s] $*"; }

python3 - "$OUT/header.json" "$NETEM" "$BIN" "${SYSCTLS[*]}" "${MODEL[*]}" "${TRAIN[*]}" <<'EOF'
import datetime, json, os, platform, subprocess, sys
out, netem, binary = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
sysctl, model, train = (a.split() for a in sys.argv[4:7])
def sh(*a):
    try: return subprocess.run(a, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception: return None
commit = sh("git", "rev-parse", "HEAD")
if commit and sh("git", "status", "--porcelain", "--untracked-files=no"): commit += "-dirty"
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": commit, "binary": binary, "version": sh(binary, "--version"),
           "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                       "loadavg_start": open("/proc/loadavg").read().split()[:3],
                       "netem_available": netem},
           "sysctl": sysctl, "model_options": model, "train_options": train,
           "untimed_steps": 2}, open(out, "w"), indent=1)
EOF

# The network of K nodes: node i's namespace has veth<i> (198.18.0.<i+1>/24), whose
# peer port<i> is a port of bridge br0 in the bridge namespace.
net_up() {
  local k=$1 i ns kv
  ip netns add "$BRNS" || return 1
  OWNED+=("$BRNS")
  ip -n "$BRNS" link add br0 type bridge || return 1
  ip -n "$BRNS" link set br0 up
  for ((i = 0; i < k; i++)); do
    ns="${PFX}n$i"
    ip netns add "$ns" || return 1
    OWNED+=("$ns")
    ip -n "$ns" link set lo up
    for kv in "${SYSCTLS[@]}"; do ip netns exec "$ns" sysctl -q -w "$kv" || return 1; done
    ip -n "$BRNS" link add "port$i" type veth peer name "veth$i" netns "$ns" || return 1
    ip -n "$BRNS" link set "port$i" master br0
    ip -n "$BRNS" link set "port$i" up
    ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev "veth$i"
    ip -n "$ns" link set "veth$i" up
  done
}
net_down() {
  local n
  for n in "${OWNED[@]}"; do ns_del "$n"; done
}
# shape K RATE_MBIT DELAY_MS: tbf (and netem delay under it) on both ends of each node's
# veth pair, so a node sends and receives at RATE; 0 removes the limit.
shape() {
  local k=$1 rate=$2 delay=$3 i dev
  for ((i = 0; i < k; i++)); do
    for dev in "${PFX}n$i veth$i" "$BRNS port$i"; do
      set -- $dev
      tc -n "$1" qdisc del dev "$2" root 2>/dev/null
      if [ "$rate" != 0 ]; then
        # burst: 256 KiB, at least one tick (4 ms) of the rate; a queue of 200 ms
        tc -n "$1" qdisc add dev "$2" root handle 1: tbf rate "${rate}mbit" burst 256kb latency 200ms || return 1
        if [ "$delay" != 0 ]; then
          tc -n "$1" qdisc add dev "$2" parent 1:1 handle 10: netem delay "${delay}ms" || return 1
        fi
      elif [ "$delay" != 0 ]; then
        tc -n "$1" qdisc add dev "$2" root netem delay "${delay}ms" || return 1
      fi
    done
  done
}
counters() {  # K: "tx rx" of each node's veth, one node a line
  local k=$1 i ns
  for ((i = 0; i < k; i++)); do
    ns="${PFX}n$i"
    if ip netns exec "$ns" true 2>/dev/null; then
      echo "$(ip netns exec "$ns" cat /sys/class/net/veth$i/statistics/tx_bytes /sys/class/net/veth$i/statistics/rx_bytes 2>/dev/null | tr '\n' ' ')"
    else
      echo "- -"
    fi
  done
}

PORT=29600
RUNNO=0
RUN_EXTRA=()  # more train options for the next start_nodes (dist.overlap)
# start_nodes NAME K P SGS STEPS TIMEOUT_S: one `launch` per node, in the background;
# sets NODE_PIDS; rank 0 writes OUT/runs/NAME/metrics.jsonl.
start_nodes() {
  local name=$1 k=$2 p=$3 sgs=$4 steps=$5 tmo=$6 i
  local dir="$OUT/runs/$name" threads=$((NPROC / (k * p)))
  ((threads >= 1)) || threads=1
  mkdir -p "$dir"
  rm -f "$dir/metrics.jsonl"
  PORT=$((PORT + 1))
  NODE_PIDS=()
  # One job secret for the run's nodes (docs/operations.md, "Rendezvous security").
  local secret
  secret=$(python3 -c "import secrets; print(secrets.token_hex(32))")
  for ((i = 0; i < k; i++)); do
    # OpenBLAS gets the cores divided among the ranks: one thread per rank on 2 cores.
    ip netns exec "${PFX}n$i" env SHARDTRAIN_GLOO_IFNAME="veth$i" OPENBLAS_NUM_THREADS=$threads \
      SHARDTRAIN_JOB_SECRET="$secret" \
      "$BIN" launch --nnodes "$k" --node-rank "$i" --nproc-per-node "$p" \
      --master-addr 198.18.0.1 --master-port "$PORT" --job-id "scaleout-$$-$name" -- \
      train "${MODEL[@]}" "${TRAIN[@]}" --train.steps="$steps" --dist.shard_group_size="$sgs" \
      --dist.timeout_s="$tmo" "${RUN_EXTRA[@]}" --run.out_dir="$dir" > "$dir/node$i.log" 2>&1 &
    NODE_PIDS+=($!)
  done
  echo "$threads" > "$dir/openblas_threads"
}
# wait_nodes NAME LIMIT_S: waits for every node (killing them after LIMIT_S), writes
# node<i>.rc; returns 0 when all exited 0.
wait_nodes() {
  local name=$1 limit=$2 dir="$OUT/runs/$1" t=0 i p alive rc all=0
  while :; do
    alive=0
    for p in "${NODE_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    if ((t >= limit * 2)); then
      echo "scaleout: $name: still running after $limit s: stopping it"
      for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
      sleep 3
      for p in "${NODE_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    fi
    sleep 0.5; t=$((t + 1))
  done
  for ((i = 0; i < ${#NODE_PIDS[@]}; i++)); do
    wait "${NODE_PIDS[$i]}" 2>/dev/null; rc=$?  # (no "Killed" line for a node killed on purpose)
    echo "$rc" > "$dir/node$i.rc"
    ((rc == 0)) || all=1
  done
  return $all
}
# wait_step NAME STEP LIMIT_S: until rank 0 has recorded STEP (0 when it did in time)
wait_step() {
  local f="$OUT/runs/$1/metrics.jsonl" t=0
  while ((t < $3 * 5)); do
    [ -f "$f" ] && python3 -c "import json,sys; sys.exit(0 if any(json.loads(l).get('step',0)>=$2 for l in open('$f') if l.strip()) else 1)" 2>/dev/null && return 0
    kill -0 "${NODE_PIDS[0]}" 2>/dev/null || return 1
    sleep 0.2; t=$((t + 1))
  done
  return 1
}

HAVE_PREDICT=0
# The whole help text first: grep -q stopping early would break the pipe (pipefail).
predict_help=$("$BIN" predict --help 2>&1 || true)
[[ $predict_help == *"Usage: "*predict* ]] && HAVE_PREDICT=1
((HAVE_PREDICT)) || echo "scaleout: '$BIN predict' is not there: predicted_step_s stays null"

# run_one K P STRATEGY RATE DELAY OVERLAP: one timed run; its record goes to OUT/runs/NAME/.
# predict's --compute-s for (shape, strategy, overlap): the unlimited-link run's median
# step less its median exposed communication (comm_blocked_s), i.e. its compute
declare -A BASE_S
declare -A INTRA_MBIT  # one TCP flow over a node's loopback, per shape with ranks sharing a node
run_one() {
  local k=$1 p=$2 strat=$3 rate=$4 delay=$5 overlap=$6 sgs=0 steps=$STEPS
  [ "$strat" = hsdp ] && sgs=$p
  ((rate != 0 && rate < 200)) && steps=$SLOW_STEPS
  RUNNO=$((RUNNO + 1))
  local name
  name=$(printf '%02d_%dx%d_%s_%s' "$RUNNO" "$k" "$p" "$strat" "$( [ "$rate" = 0 ] && echo nolimit || echo "${rate}mbit")")
  [ "$delay" != 0 ] && name+="_${delay}ms"
  [ "$overlap" = off ] && name+="_nooverlap"
  local dir="$OUT/runs/$name"
  mkdir -p "$dir"
  shape "$k" "$rate" "$delay" || { echo "scaleout: $name: tc failed"; return 1; }
  # one TCP flow node 0 -> node 1 for 2 s: what the shaped link gives a single stream
  ip netns exec "${PFX}n1" python3 "$HERE/scaleout.py" tcp-recv 5201 &
  local rx=$!
  ip netns exec "${PFX}n0" python3 "$HERE/scaleout.py" tcp-send 198.18.0.2 5201 2 > "$dir/tcp_mbit" 2> "$dir/tcp.err"
  wait "$rx" 2>/dev/null
  if ((p > 1)) && [ -z "${INTRA_MBIT[$k.$p]:-}" ]; then  # ranks of one node talk over its loopback
    ip netns exec "${PFX}n0" python3 "$HERE/scaleout.py" tcp-recv 5202 &
    rx=$!
    INTRA_MBIT[$k.$p]=$(ip netns exec "${PFX}n0" python3 "$HERE/scaleout.py" tcp-send 127.0.0.1 5202 1 2>/dev/null | cut -d' ' -f1)
    wait "$rx" 2>/dev/null
  fi
  counters "$k" > "$dir/counters_before"
  local t1 t2 ok=1
  t1=$(date +%s.%N)
  RUN_EXTRA=(--dist.overlap="$( [ "$overlap" = on ] && echo true || echo false)")
  start_nodes "$name" "$k" "$p" "$sgs" "$steps" 120
  RUN_EXTRA=()
  wait_nodes "$name" 900 || ok=0
  t2=$(date +%s.%N)
  counters "$k" > "$dir/counters_after"
  local key="$k.$p.$strat.$overlap"
  if ((HAVE_PREDICT)) && [ "$rate" != 0 ] && [ -n "${BASE_S[$key]:-}" ]; then
    # The link as one TCP flow measured it just before the run (the payload rate a
    # collective can get), else the tbf rate; loopback within a node likewise.
    local gbps intra=()
    gbps=$(python3 -c "print(float(open('$dir/tcp_mbit').read().split()[0]) / 1000)" 2>/dev/null) || gbps=$(python3 -c "print($rate / 1000)")
    # The host's CPU per byte on this link (the same flow), on the cores a node has.
    local net_ns cores
    net_ns=$(python3 -c "print(float(open('$dir/tcp_mbit').read().split()[1]))" 2>/dev/null) || net_ns=0
    cores=$(python3 -c "print($NPROC / $k)")
    ((p > 1)) && intra=(--intra-gbps "$(python3 -c "print(float('${INTRA_MBIT[$k.$p]:-20000}')/1000)")" --intra-latency-us 10)
    "$BIN" predict "${MODEL[@]}" "${TRAIN[@]}" --train.steps="$steps" --dist.shard_group_size="$sgs" \
      --nodes "$k" --ranks-per-node "$p" --inter-gbps "$gbps" "${intra[@]}" \
      --inter-latency-us "$((delay * 1000 + 10))" --compute-s "${BASE_S[$key]}" \
      --host-net-ns-per-byte "$net_ns" --host-cores-per-node "$cores" \
      --schedule "$( [ "$overlap" = on ] && echo prefetch || echo none)" --json \
      > "$dir/predict.json" 2> "$dir/predict.err" || echo "scaleout: $name: predict failed (see $dir/predict.err)"
  fi
  python3 "$HERE/scaleout.py" record "$dir" nodes=$k ranks_per_node=$p strategy=$strat overlap=$overlap \
    shard_group_size=$sgs link_mbit=$rate delay_ms=$delay steps=$steps wall_s="$(python3 -c "print(round($t2-$t1,2))")" \
    intra_one_flow_mbit="${INTRA_MBIT[$k.$p]:-}"
  echo "$name" >> "$OUT/runs.order"
  local med compute
  med=$(python3 -c "import json; print(json.load(open('$dir/record.json'))['step_s'] or '')")
  compute=$(python3 -c "import json; print(json.load(open('$dir/record.json')).get('compute_s') or '')")
  [ "$rate" = 0 ] && [ "$delay" = 0 ] && [ -n "$compute" ] && BASE_S[$key]=$compute
  stamp "$name: $( ((ok)) && echo "median step ${med} s" || echo "FAILED (see $dir/node*.log)")"
  return $((1 - ok))
}

# Faults, on a 2 x 1 FSDP job over an unlimited link with dist.timeout_s small.
fault_one() {
  local kind=$1 k=2 p=1 steps=12 dir name
  RUNNO=$((RUNNO + 1))
  name=$(printf '%02d_fault_%s' "$RUNNO" "$kind")
  dir="$OUT/runs/$name"
  mkdir -p "$dir"
  [ "$kind" = linkdown ] || steps=60
  net_up "$k" || { echo "scaleout: $name: could not make the network"; return 1; }
  counters "$k" > "$dir/counters_before"
  start_nodes "$name" "$k" "$p" 0 "$steps" "$FAULT_TIMEOUT"
  if ! wait_step "$name" 3 300; then
    echo "scaleout: $name: the run did not reach step 3"
    wait_nodes "$name" 30
    python3 "$HERE/scaleout.py" fault "$dir" kind=$kind timeout_s=$FAULT_TIMEOUT steps=$steps at_step=none
    echo "$name" >> "$OUT/runs.order"; net_down; return 1
  fi
  local at t1 t2
  at=$(python3 -c "import json; print(max(json.loads(l).get('step',0) for l in open('$dir/metrics.jsonl') if l.strip()))")
  t1=$(date +%s.%N)
  case $kind in
    linkdown)
      stamp "$name: after step $at: veth1 in node 1's namespace down for 5 s"
      ip -n "${PFX}n1" link set veth1 down
      sleep 5
      ip -n "${PFX}n1" link set veth1 up
      t2=$(date +%s.%N)
      wait_nodes "$name" 300
      ;;
    nodelost|nodekill)
      if [ "$kind" = nodelost ]; then
        # cut the link first, so the node vanishes without closing its connections
        stamp "$name: after step $at: node 1 lost (link cut, processes killed, namespace deleted)"
        ip -n "$BRNS" link del port1
      else
        stamp "$name: after step $at: node 1 killed (processes killed, then namespace deleted)"
      fi
      # node 1's launch is killed on purpose: its status is not waited for (nor reported
      # by bash as "Killed")
      disown "${NODE_PIDS[1]}" 2>/dev/null
      kill -KILL $(ip netns pids "${PFX}n1") 2>/dev/null
      ns_del "${PFX}n1"
      echo 137 > "$dir/node1.rc"
      NODE_PIDS=("${NODE_PIDS[0]}")
      local t=0 err=""
      while kill -0 "${NODE_PIDS[0]}" 2>/dev/null && ((t < (FAULT_TIMEOUT + 60) * 5)); do
        [ -z "$err" ] && grep -q "error:" "$dir/node0.log" && err=$(date +%s.%N)
        sleep 0.2; t=$((t + 1))
      done
      t2=$(date +%s.%N)
      [ -z "$err" ] && grep -q "error:" "$dir/node0.log" && err=$t2
      python3 -c "print(round($t2 - $t1, 2))" > "$dir/exit_after_s"
      [ -n "$err" ] && python3 -c "print(round($err - $t1, 2))" > "$dir/error_after_s"
      wait_nodes "$name" 30
      ;;
  esac
  counters "$k" > "$dir/counters_after"
  python3 "$HERE/scaleout.py" fault "$dir" kind=$kind timeout_s=$FAULT_TIMEOUT steps=$steps at_step=$at
  echo "$name" >> "$OUT/runs.order"
  stamp "$name: $(python3 -c "import json; print(json.load(open('$dir/record.json'))['outcome'])")"
  net_down
}

FAILED=0
for sh_ in $SHAPES; do
  k=${sh_%x*} p=${sh_#*x}
  if ((k * p > NPROC)); then
    echo "scaleout: note: $k x $p = $((k * p)) ranks on $NPROC cores: each rank gets $NPROC/$((k * p)) of a core, so compute takes about $((k * p))/$NPROC times as long as with a core per rank, and the ranks' Gloo threads wait for a core too: these step times are not comparable with a shape that fits the cores"
  fi
  net_up "$k" || { echo "scaleout: could not make the network of $k nodes"; exit 1; }
  for strat in $STRATS; do
    ((p == 1)) && [ "$strat" = hsdp ] && echo "scaleout: $k x 1 HSDP: one rank per node, so HSDP is pure replication (every rank holds the whole model; gradients are all-reduced across nodes)"
    for r in $RATES; do
      rate=${r%@*} delay=0
      [[ $r == *@* ]] && delay=${r#*@}
      if [ "$delay" != 0 ] && ((!NETEM)); then
        echo "scaleout: skipping $r (delay needs sch_netem, which this kernel lacks)"; continue
      fi
      for ov in $OVERLAPS; do run_one "$k" "$p" "$strat" "$rate" "$delay" "$ov" || FAILED=1; done
    done
  done
  net_down
done
for f in $FAULTS; do fault_one "$f" || FAILED=1; done

cut -d' ' -f1-3 /proc/loadavg > "$OUT/loadavg_end"
python3 "$HERE/scaleout.py" assemble "$OUT" || FAILED=1
stamp "wrote $OUT/scaleout.json"
# The page: steps/s against link rate, measured and predicted, and the tables
# (shardtrain report --scaleout; a binary without it is told apart by its help, read
# whole: grep -q would break the pipe under pipefail).
report_help=$("$BIN" report --help 2>&1)
if [[ $report_help == *--scaleout* ]]; then
  "$BIN" report --scaleout "$OUT" --out "$OUT/scaleout.html" --svg "$OUT/scaleout.svg" || FAILED=1
fi
if ((QUICK)); then
  python3 "$HERE/scaleout.py" check "$OUT" || exit 1
  exit 0
fi
exit $FAILED
