#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) and runs each on its
# seed corpus for SECONDS_PER_TARGET (default 60); fails if any target finds a crash,
# a sanitizer report, a broken invariant, a timeout or an out-of-memory.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]      (targets: fuzz/README.md)
#
# New inputs go to <build>/work/<target>/, never into the committed fuzz/corpus/;
# findings to <build>/artifacts/<target>/, each run's log to <build>/logs/<target>.log.
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_PARALLEL (targets run at
# once; default the number of cores), FUZZ_RSS_MB (per-target memory limit, 2048),
# CXX (default clang++). The libraries are those scripts/setup.sh installs; clang and
# its libFuzzer runtime are installed here when missing (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."

install_missing() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "fuzz: installing ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
if [ -z "${CXX:-}" ]; then
  command -v clang++ >/dev/null || install_missing clang
  clang_major=$(clang++ -dumpversion | cut -d. -f1)
  install_missing "libclang-rt-${clang_major}-dev"  # libFuzzer and the sanitizer runtimes
fi

seconds=${1:-60}
shift || true
build=${FUZZ_BUILD_DIR:-build-fuzz}
parallel=${FUZZ_PARALLEL:-$(nproc)}
rss_mb=${FUZZ_RSS_MB:-2048}
all_targets=(safetensors config_json run_config npy nccl_log tokenizer tokenizer_encode token_shards checkpoint
  cluster_file)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

start=$SECONDS
cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="${CXX:-clang++}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
echo "fuzz: built in $((SECONDS - start)) s; ${#targets[@]} targets, ${seconds} s each, ${parallel} at a time"

mkdir -p "$build/logs"
run_one() {
  local t=$1
  local work="$build/work/$t" art="$build/artifacts/$t/" dict=()
  mkdir -p "$work" "$art"
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  # -timeout: one input running this long is a hang (a finding); -rss_limit_mb: so is
  # a run growing past it. The committed seeds are read, never written.
  "$build/fuzz_$t" "${dict[@]}" -max_total_time="$seconds" -timeout=25 -rss_limit_mb="$rss_mb" \
    -print_final_stats=1 -artifact_prefix="$art" "$work" "fuzz/corpus/$t" >"$build/logs/$t.log" 2>&1
}

declare -A status
pids=()
names=()
for t in "${targets[@]}"; do
  [ -x "$build/fuzz_$t" ] || { echo "fuzz: no target fuzz_$t" >&2; exit 2; }
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  status[${names[$i]}]=$rc
done

failed=0
printf '%-18s %-6s %12s %8s %8s %8s\n' target result execs exec/s cov corpus
for t in "${targets[@]}"; do
  log="$build/logs/$t.log"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
  result=ok
  if [ "${status[$t]}" != 0 ]; then
    result=FAILED
    failed=1
  fi
  printf '%-18s %-6s %12s %8s %8s %8s\n' "$t" "$result" "${execs:--}" "${rate:--}" "${cov:--}" "${corp:--}"
done
if ((failed)); then
  for t in "${targets[@]}"; do
    [ "${status[$t]}" = 0 ] && continue
    echo "---- fuzz_$t (exit ${status[$t]}): $build/logs/$t.log"
    grep -E -A 30 '^==[0-9]+==ERROR|runtime error|^SUMMARY|deadly signal|Test unit written' "$build/logs/$t.log" | head -60
    ls "$build/artifacts/$t/" 2>/dev/null | sed "s|^|  $build/artifacts/$t/|"
  done
  echo "fuzz: FAILED (reproduce: $build/fuzz_<target> <artifact>)" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean in $((SECONDS - start)) s"
