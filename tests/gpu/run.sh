#!/bin/sh
# GPU checks for a machine with an NVIDIA GPU and driver (everything else runs in `make test` on
# CPU-only machines).  Builds stoke (Release) in $BUILD, then:
#   1. stoke devices: cuda must be available, with its devices
#   2. the cuda tests: test_cuda_mock, and test_cuda_gpu on the real GPU (a skip is a failure)
#   3. stoke bench copy: host<->device bandwidth from pinned and pageable memory
#   4. the loader to the device: stoke load ... --device cuda --verify must give the host path's
#      content_hash, for synthetic data and for a .npy file; the same through a node-wide arena
#      shared by two processes; Python's DLPack and is_pinned
#   5. the drop-in DataLoader from a parent with CUDA initialized: process workers' batches
#      equal torch's and pinned for CUDA (tests/gpu/dropin_cuda.py)
# and prints one table.  Takes about a minute (build included); every step has a time limit.
#
#   tests/gpu/run.sh                    # BUILD=build-gpu, BACKEND=cuda
#   BACKEND=opencl tests/gpu/run.sh     # dry run of the script on PoCL (STOKE_ACCELERATOR=opencl)
# Exit status: 0 when every check passed, 1 otherwise.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
BACKEND=${BACKEND:-cuda}
JOBS=$(nproc 2>/dev/null || echo 4)
LOG=$BUILD/gpu-checks.log
CLI=$BUILD/stoke
ROWS=""
FAILED=0

mkdir -p "$BUILD"
: >"$LOG"
row() { # check, PASS/FAIL, detail
    ROWS="$ROWS$(printf '%-28s %-5s %s' "$1" "$2" "$3")
"
    [ "$2" = PASS ] || FAILED=1
}
field() { # json, key -> value (first occurrence, quotes stripped)
    printf '%s' "$1" | grep -o "\"$2\": \"\{0,1\}[^\",}]*" | head -n 1 |
        sed "s/^\"$2\": \"\{0,1\}//"
}
step() { # name, seconds, command...: runs with a limit, output to the log; returns its status
    name=$1 secs=$2
    shift 2
    echo "=== $name: $*" >>"$LOG"
    timeout "$secs" "$@" >>"$LOG" 2>&1
}

echo "stoke GPU checks ($BACKEND) in $BUILD; details in $LOG"
command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1

# The interpreter that has torch (on a GPU machine's image, often not /usr/bin/python3): the
# extension is built for it.  cmocka, where the machine has none and pkg-config cannot find
# one, from $ROOT/.gpu-deps/usr (Debian's libcmocka0 and libcmocka-dev unpacked there with
# dpkg -x, carried beside the tree: docs/development.md, "GPU checks").
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for p in "$(command -v python3)" /usr/bin/python3; do
        if [ -n "$p" ] && "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
    done
    PY=${PY:-/usr/bin/python3}
fi
CONF=""
if [ -d "$ROOT/.gpu-deps/usr" ]; then
    CONF="-DCMAKE_PREFIX_PATH=$ROOT/.gpu-deps/usr"
    # pkg-config looks there too (CMake adds the prefix path to its search): Debian's .pc file
    # names /usr, rewritten to where the files are
    for pc in "$ROOT"/.gpu-deps/usr/lib/*/pkgconfig/cmocka.pc; do
        [ -f "$pc" ] && sed -i "s|-L/usr/|-L$ROOT/.gpu-deps/usr/|; s|-I/usr/|-I$ROOT/.gpu-deps/usr/|" "$pc"
    done
fi

# 0. build ----------------------------------------------------------------------------------
# shellcheck disable=SC2086 # CONF is empty or one word
if step configure 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$PY" $CONF &&
    step build 240 cmake --build "$BUILD" -j "$JOBS"; then
    row build PASS "Release, $JOBS jobs"
else
    row build FAIL "see $LOG"
    printf '\n%s' "$ROWS"
    exit 1
fi
export STOKE_ACCELERATOR=$BACKEND STOKE_PLUGIN_PATH=

# 1. devices --------------------------------------------------------------------------------
dev=$(timeout 60 "$CLI" devices --json 2>>"$LOG")
echo "$dev" >>"$LOG"
if [ "$(field "$dev" backend)" = "$BACKEND" ]; then
    row "devices" PASS "$(field "$dev" device_count) device(s): $(field "$dev" name)"
else
    row "devices" FAIL "$BACKEND unavailable: $(printf '%s' "$dev" |
        sed -n "s/.*\"name\": \"$BACKEND\"[^}]*\"reason\": \"\([^\"]*\)\".*/\1/p")"
fi

# 2. tests ----------------------------------------------------------------------------------
if [ -d "$BUILD/tests" ]; then
    for t in test_cuda_mock test_cuda_gpu; do
        out=$(cd "$BUILD" && timeout 120 ctest -R "^$t\$" -V 2>&1)
        rc=$? # ctest's status, not its wording (which changes between versions)
        echo "$out" >>"$LOG"
        if [ "$rc" != 0 ]; then
            row "$t" FAIL "ctest exit $rc: see $LOG"
        elif printf '%s' "$out" | grep -q "SKIPPED"; then
            if [ "$BACKEND" = cuda ]; then
                row "$t" FAIL "skipped: no usable GPU"
            else
                row "$t" PASS "skipped ($BACKEND dry run)"
            fi
        elif printf '%s' "$out" | grep -q "\[  PASSED  \]"; then
            row "$t" PASS "$(printf '%s' "$out" | grep -c '\[       OK \]') test(s)"
        else
            row "$t" FAIL "no cmocka summary: see $LOG"
        fi
    done
else
    row "tests" FAIL "not built (cmocka missing: make deps)"
fi

# 3. bench copy -----------------------------------------------------------------------------
bench=$(timeout 180 "$CLI" bench copy --json 2>>"$LOG")
echo "$bench" >>"$LOG"
big=$(printf '%s' "$bench" | sed -n 's/.*{"size": 67108864, \([^}]*\)}.*/\1/p')
small=$(printf '%s' "$bench" | sed -n 's/.*{"size": 65536, \([^}]*\)}.*/\1/p')
if [ -n "$big" ]; then
    row "bench copy 64 MiB" PASS "h2d pinned $(field "$big" h2d_pinned_gbps) GB/s, pageable $(field "$big" h2d_pageable_gbps) GB/s; d2h pinned $(field "$big" d2h_pinned_gbps) GB/s"
    row "bench copy 64 KiB" PASS "h2d pinned $(field "$small" h2d_pinned_gbps) GB/s, pageable $(field "$small" h2d_pageable_gbps) GB/s"
else
    row "bench copy" FAIL "see $LOG"
fi

# 4. loader to the device -------------------------------------------------------------------
load_check() { # label, source, options
    host=$(STOKE_ACCELERATOR= timeout 120 "$CLI" load "$2" $3 --json 2>>"$LOG")
    devr=$(timeout 120 "$CLI" load "$2" $3 --device "$BACKEND" --verify --json 2>>"$LOG")
    echo "$host" >>"$LOG"
    echo "$devr" >>"$LOG"
    h=$(field "$host" content_hash)
    d=$(field "$devr" content_hash)
    if [ -n "$h" ] && [ "$h" = "$d" ] && [ "$(field "$devr" verified)" = true ]; then
        row "$1" PASS "hash $d, $(field "$devr" device_copies) copies, $(field "$devr" samples_per_s) samples/s (host $(field "$host" samples_per_s))"
    else
        row "$1" FAIL "host hash '$h', device hash '$d', verified '$(field "$devr" verified)'"
    fi
}
load_check "load synthetic --device" "synthetic:100000,shape=3x64x64" \
    "--batch-size 256 --workers 4 --shuffle --seed 3"
npy=$BUILD/gpu-check.npy
if command -v python3 >/dev/null 2>&1 && python3 - "$npy" <<'EOF'
import struct, sys
n, c, w = 20000, 3, 32
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (n, c, w)
total = (10 + len(d) + 1 + 63) // 64 * 64
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", total - 10) + d.encode()
            + b" " * (total - 11 - len(d)) + b"\n")
    f.write(struct.pack("<%df" % (n * c * w), *[(i % 977) * 0.5 for i in range(n * c * w)]))
EOF
then
    load_check "load npy --device" "npy:$npy" "--batch-size 128 --workers 4"
else
    row "load npy --device" FAIL "could not write a .npy (python3 missing?)"
fi

# Arena (issue 12): two processes load through one node-wide arena (a memfd registered with
# cuMemHostRegister in each; the second attaches without a size), copying to the device: both
# must verify and give the same content_hash.
arena="gpucheck-$$"
timeout 120 "$CLI" load "synthetic:20000,shape=3x32x32" --batch-size 256 --workers 2 \
    --arena "$arena:256M" --device "$BACKEND" --verify --json >"$BUILD/arena1.json" 2>>"$LOG" &
p1=$!
sleep 0.2
a2=$(timeout 120 "$CLI" load "synthetic:20000,shape=3x32x32" --batch-size 256 --workers 2 \
    --arena "$arena" --device "$BACKEND" --verify --json 2>>"$LOG")
wait "$p1"
a1=$(cat "$BUILD/arena1.json")
echo "$a1" >>"$LOG"
echo "$a2" >>"$LOG"
if [ -n "$(field "$a2" content_hash)" ] && [ "$(field "$a2" content_hash)" = "$(field "$a1" content_hash)" ] &&
    [ "$(field "$a1" verified)" = true ] && [ "$(field "$a2" verified)" = true ]; then
    row "arena --device" PASS "hash $(field "$a2" content_hash), $(field "$a2" samples_per_s) samples/s"
else
    row "arena --device" FAIL "arena hash '$(field "$a2" content_hash)', plain '$(field "$a1" content_hash)'"
fi

# Python (issue 10): a device batch through torch.from_dlpack (values equal the .npy rows), and a
# host batch pinned for CUDA seen by torch as pinned, at the batch's own address.
if [ -d "$BUILD/python/stoke" ] && [ -f "$npy" ] && "$PY" -c "import torch, numpy" 2>/dev/null; then
    out=$(PYTHONPATH="$BUILD/python" "$PY" - "$npy" 2>&1 <<'EOF'
import sys, numpy as np, torch, stoke
x = np.load(sys.argv[1], mmap_mode="r")
ok = torch.cuda.is_available()
dev = stoke.DataLoader("npy:" + sys.argv[1], batch_size=64, device="cuda", num_workers=2)
host = stoke.DataLoader("npy:" + sys.argv[1], batch_size=64, num_workers=2)
n = 0
for bd, bh in zip(dev, host):
    t = torch.from_dlpack(bd["data"])
    ok &= t.is_cuda and bool((t.cpu().numpy() == x[np.asarray(bd.indices)]).all())
    th = torch.from_dlpack(bh["data"])
    ok &= th.is_pinned() and th.data_ptr() == bh.data_ptr(0)
    ok &= bool((th.to("cuda", non_blocking=True).cpu() == th).all())
    n += 1
    if n == 20:
        break
print("ok" if ok and n == 20 else "bad", n)
EOF
)
    case "$out" in
    ok*) row "python dlpack + is_pinned" PASS "$out" ;;
    *) row "python dlpack + is_pinned" FAIL "$(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')" ;;
    esac
else
    row "python dlpack + is_pinned" FAIL "no Python package, npy file or torch"
fi

# The drop-in DataLoader (issue 27): from a parent that initialized CUDA and torch's thread
# pool, process workers' batches equal torch's DataLoader's and are pinned for CUDA (torch's
# is_pinned), copied to the GPU asynchronously and back equal (tests/gpu/dropin_cuda.py).
if [ -d "$BUILD/python/stoke" ] && "$PY" -c "import torch" 2>/dev/null; then
    echo "=== dropin_cuda.py" >>"$LOG"
    dry=""
    [ "$BACKEND" = cuda ] || dry=--cpu # the comparisons without the GPU
    # shellcheck disable=SC2086 # dry is empty or one word
    # STOKE_ACCELERATOR unset: the drop-in pins for the accelerator stoke picks by itself
    out=$(env -u STOKE_ACCELERATOR PYTHONPATH="$BUILD/python" timeout 300 "$PY" \
        "$ROOT/tests/gpu/dropin_cuda.py" $dry 2>&1)
    rc=$?
    echo "$out" >>"$LOG"
    for c in setup tensor dict pad collate epochs race; do
        line=$(printf '%s\n' "$out" | grep -E "^(ok|FAIL) $c " | head -n 1)
        case "$line" in
        ok*) row "dropin $c" PASS "${line#ok "$c" }" ;;
        FAIL*) row "dropin $c" FAIL "${line#FAIL "$c" }" ;;
        *) row "dropin $c" FAIL "no result (exit $rc): $(printf '%s' "$out" | tail -n 2 | tr '\n' ' ')" ;;
        esac
    done
else
    row "dropin" FAIL "no Python package (python3-dev for $PY?) or no torch"
fi

printf '\n%-28s %-5s %s\n' CHECK RESULT DETAIL
printf '%s' "$ROWS"
[ "$FAILED" = 0 ] && echo "all GPU checks passed" || echo "some GPU checks FAILED (details in $LOG)"
exit "$FAILED"
