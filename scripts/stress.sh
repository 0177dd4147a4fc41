#!/bin/sh
# Runs every test labelled `stress` (the tests that start threads) N times in a row each, stopping
# a test at its first failure, while a CPU hog keeps one core busy so that threads are preempted
# at odd moments.  Exits non-zero if any run failed; CTest's output then names the test and the
# failed assertion.  The hog is killed on every exit path (and stops by itself if this script is
# killed outright).
#
#     scripts/stress.sh BUILD_DIR [N] [extra ctest arguments...]     (default N=50)
#
# STRESS_JOBS: tests run at once (default: the number of CPUs); STRESS_HOGS: busy processes
# (default 1).
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [N] [ctest arguments...]" >&2
    exit 2
fi
build=$1
n=${2:-50}
[ $# -ge 2 ] && shift 2 || shift 1
case $n in
'' | *[!0-9]* | 0)
    echo "stress: N must be a positive number, not '$n'" >&2
    exit 2
    ;;
esac
jobs=${STRESS_JOBS:-$(nproc 2>/dev/null || echo 2)}
hogs=${STRESS_HOGS:-1}

hog_pids=""
stop_hogs() {
    for p in $hog_pids; do
        kill "$p" 2>/dev/null || true
    done
    for p in $hog_pids; do
        wait "$p" 2>/dev/null || true
    done
    hog_pids=""
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

me=$$
i=0
while [ "$i" -lt "$hogs" ]; do
    # Busy, and gone by itself once this script is (kill -0 fails when it has exited).
    (
        while kill -0 "$me" 2>/dev/null; do
            j=0
            while [ "$j" -lt 20000 ]; do j=$((j + 1)); done
        done
    ) &
    hog_pids="$hog_pids $!"
    i=$((i + 1))
done

echo "stress: ${n} runs of each 'stress' test in $build, $jobs at once, next to $hogs CPU hog(s)"
start=$(date +%s)
status=0
ctest --test-dir "$build" -L stress --repeat until-fail:"$n" --no-tests=error \
    --output-on-failure -j "$jobs" "$@" || status=$?
echo "stress: $(( $(date +%s) - start ))s, ctest exit status $status"
exit "$status"
