#!/bin/sh
# Installs the Debian packages stoke's tests and optional features need, when they are missing.
# As root it runs apt-get itself, with sudo it uses sudo, otherwise it prints the command and
# stops.  Optional: STOKE_DEPS_EXTRA="python3-torch python3-numpy python3-torchvision" for the benchmarks.
# Then the S3 server of the remote-shard tests (s3rver, npm) into tests/remote/node_modules, when
# npm is there (without it those tests skip, saying why).
set -eu
need="libcmocka-dev pkg-config pocl-opencl-icd ocl-icd-libopencl1 clang libclang-rt-dev liburing-dev libjpeg62-turbo-dev libcurl4-openssl-dev zlib1g-dev nginx-light python3-dev python3-numpy python3-torch python3-torchvision openmpi-bin python3-venv python3-build python3-mypy"
here=$(cd "$(dirname "$0")/.." && pwd)

# s3rver, pinned by tests/remote/package-lock.json; never fatal: the test skips without it.
s3rver() {
    [ -f "$here/tests/remote/node_modules/s3rver/bin/s3rver.js" ] && return 0
    if ! command -v npm >/dev/null 2>&1; then
        echo "stoke: npm not found: the S3 tests (tests/python/test_remote_s3.py) will skip" >&2
        return 0
    fi
    echo "stoke: installing s3rver into tests/remote/node_modules (npm ci)"
    (cd "$here/tests/remote" && npm ci --no-audit --no-fund --loglevel=error) ||
        echo "stoke: npm ci failed: the S3 tests will skip" >&2
}
extra="${STOKE_DEPS_EXTRA:-}"
missing=""
for p in $need $extra; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
s3rver
[ -z "$missing" ] && exit 0
cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo"
else
    echo "stoke: missing Debian packages:$missing" >&2
    echo "stoke: install them with: sudo apt-get update && sudo $cmd" >&2
    exit 1
fi
echo "stoke: installing missing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo $cmd
