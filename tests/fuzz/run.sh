#!/bin/sh
# Builds the libFuzzer target for the .npy header parser with clang and runs it for a bounded
# time over the committed seed corpus.  Exits non-zero if the fuzzer finds a crash, a sanitizer
# report or a broken invariant (the reproducer is left in BUILD_DIR/fuzz-artifacts/).
#
#     tests/fuzz/run.sh BUILD_DIR [SECONDS]     (default 60 s; CC overrides clang)
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [SECONDS]" >&2
    exit 2
fi
build=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cc=${CC:-clang}

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DSTOKE_FUZZ=ON -DSTOKE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_npy_header -j2
fuzzer=$build/tests/fuzz/fuzz_npy_header

# New inputs go to a scratch corpus in the build dir, never into the repository.
mkdir -p "$build/fuzz-corpus" "$build/fuzz-artifacts"
echo "fuzz: running $fuzzer for ${secs}s"
"$fuzzer" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
    -dict="$here/npy.dict" -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1 \
    "$build/fuzz-corpus" "$here/corpus"
echo "fuzz: no crash in ${secs}s"
