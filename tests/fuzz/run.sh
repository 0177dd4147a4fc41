#!/bin/sh
# Builds a libFuzzer target with clang and runs it for a bounded time over its committed seed
# corpus: TARGET npy (default: the .npy header parser, corpus/), tar (the tar parser,
# corpus_tar/), idx (the sidecar index parser, corpus_idx/), answer (a remote HTTP answer's
# headers and body, corpus_answer/; needs libcurl's headers), aws (the AWS credentials and
# config files, corpus_aws/; needs libcurl) or spec (shard patterns' brace expansion and the
# redaction of URLs, corpus_spec/).  Exits non-zero if the fuzzer finds a crash, a sanitizer
# report or a broken invariant (1: libFuzzer's own 77 would read as a skip to a test runner; the
# reproducer is left in BUILD_DIR/fuzz-artifacts/).
#
#     tests/fuzz/run.sh BUILD_DIR [SECONDS] [TARGET]     (default 60 s, npy; CC overrides clang)
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [SECONDS] [TARGET]" >&2
    exit 2
fi
build=$1
secs=${2:-60}
target=${3:-npy}
case $target in
npy) name=fuzz_npy_header corpus=corpus dict="-dict=$(cd "$(dirname "$0")" && pwd)/npy.dict" maxlen=4096 ;;
tar) name=fuzz_tar_header corpus=corpus_tar dict= maxlen=16384 ;;
idx) name=fuzz_tar_index corpus=corpus_idx dict= maxlen=4096 ;;
answer) name=fuzz_remote_answer corpus=corpus_answer dict= maxlen=4096 ;;
aws) name=fuzz_remote_aws corpus=corpus_aws dict= maxlen=8192 ;;
spec) name=fuzz_spec corpus=corpus_spec dict= maxlen=1024 ;;
*) echo "$0: unknown target '$target' (npy, tar, idx, answer, aws or spec)" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cc=${CC:-clang}

cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DSTOKE_FUZZ=ON -DSTOKE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target "$name" -j2
fuzzer=$build/tests/fuzz/$name

# New inputs go to a scratch corpus in the build dir, never into the repository.
mkdir -p "$build/fuzz-corpus-$target" "$build/fuzz-artifacts"
echo "fuzz: running $fuzzer for ${secs}s"
# shellcheck disable=SC2086 # $dict is empty or one word
"$fuzzer" -max_total_time="$secs" -max_len="$maxlen" -timeout=10 -rss_limit_mb=1024 \
    -error_exitcode=1 $dict -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1 \
    "$build/fuzz-corpus-$target" "$here/$corpus"
echo "fuzz: no crash in ${secs}s"
