#!/usr/bin/env bash
# Builds shardtrain and its CPU test suite with AddressSanitizer + UndefinedBehavior-
# Sanitizer (no CUDA) and runs the tests; any sanitizer report fails the test it
# happens in, and so the script.
#
#   scripts/sanitize.sh [CTEST_ARGS ...]     e.g. scripts/sanitize.sh -R Tokenizer
#
# Environment: SANITIZE_BUILD_DIR (default build-asan), SANITIZE_TIMEOUT (seconds per
# test, default 900), SANITIZE_JOBS (ctest -j, default the number of cores), CXX.
# Tests labelled gpu are left out (they skip without a GPU anyway). Needs what
# scripts/setup.sh installs (run it first on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${SANITIZE_BUILD_DIR:-build-asan}
timeout=${SANITIZE_TIMEOUT:-900}
jobs=${SANITIZE_JOBS:-$(nproc)}
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

start=$SECONDS
# -O1 -g1 without NDEBUG: asserts stay on, stack traces keep file and line (-g1: line
# tables only, much quicker to compile and link than -g), the tests stay fast.
cmake -S . -B "$build" -G Ninja -DSHARDTRAIN_CUDA=OFF -DSHARDTRAIN_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "sanitize: built in $((SECONDS - start)) s"

# Fail hard: the first report stops the process (a non-zero exit, so the test fails),
# with a stack trace. Leaks are errors too (LeakSanitizer runs at each process's exit).
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:print_stacktrace=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}"

run_start=$SECONDS
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE gpu --timeout "$timeout" "$@"
echo "sanitize: tests passed in $((SECONDS - run_start)) s (total $((SECONDS - start)) s)"
