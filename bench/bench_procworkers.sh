#!/bin/sh
# Thread vs process workers on `npy:` rows of 3 KB: samples/s (stoke load --json) and memory, the
# peak RSS of the stoke process plus all its descendants (zygote, worker children), sampled from
# /proc every 50 ms.  Writes the .npy itself (no numpy needed).
#   bench/bench_procworkers.sh [STOKE_BINARY] [ROWS] [WORKERS] [IO]
# Defaults: build/stoke, 100000 rows (300 MB), 2 workers, io=auto (npy's io= option: auto, mmap,
# pread, uring).  Each mode runs 3 times; the best
# samples/s and the largest peak RSS are printed.
set -eu
STOKE=${1:-build/stoke}
ROWS=${2:-100000}
WORKERS=${3:-2}
IO=${4:-auto}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
NPY=$DIR/rows.npy
python3 - "$NPY" "$ROWS" <<'PY'
import sys
path, rows = sys.argv[1], int(sys.argv[2])
hdr = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, 3072), }" % rows
pad = 64 - (10 + len(hdr) + 1) % 64
hdr = hdr + " " * pad + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
    row = bytes(range(256)) * 12
    for i in range(rows):
        f.write(row)
PY

# Peak RSS (KiB) of pid $1 and its descendants until it exits.
peak_rss() {
    peak=0
    # until it exits (a zombie, not yet waited for, counts as exited)
    while [ -r /proc/"$1"/status ] && ! grep -q '^State:.*Z' /proc/"$1"/status 2>/dev/null; do
        pids="$1"
        frontier="$1"
        while [ -n "$frontier" ]; do
            next=""
            for p in $frontier; do
                kids=$(cat /proc/"$p"/task/*/children 2>/dev/null || true)
                next="$next $kids"
            done
            frontier=$(echo $next)
            pids="$pids $frontier"
        done
        total=0
        for p in $pids; do
            r=$(awk '/^VmRSS:/ {print $2}' /proc/"$p"/status 2>/dev/null || echo 0)
            total=$((total + ${r:-0}))
        done
        [ "$total" -gt "$peak" ] && peak=$total
        sleep 0.05
    done
    echo "$peak"
}

for mode in threads processes; do
    best=0
    mem=0
    for run in 1 2 3; do
        "$STOKE" load "npy:$NPY,io=$IO" --batch-size 256 --workers "$WORKERS" --shuffle --no-hash \
            --no-pin-memory --worker-mode="$mode" --json >"$DIR/out.json" &
        pid=$!
        rss=$(peak_rss "$pid")
        wait "$pid"
        sps=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"], d; print(int(d["samples_per_s"]))' "$DIR/out.json")
        [ "$sps" -gt "$best" ] && best=$sps
        [ "$rss" -gt "$mem" ] && mem=$rss
    done
    echo "$mode: io=$IO, $WORKERS workers, $ROWS rows of 3072 B: $best samples/s, peak RSS (all processes) $((mem / 1024)) MiB"
done
