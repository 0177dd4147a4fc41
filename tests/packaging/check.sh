#!/bin/sh
# The Python package as a user installs it (CTest `packaging`; docs/development.md):
#  1. a clean copy of the tree (git's tracked and not-ignored files, no build/);
#  2. pip install --no-build-isolation --no-index COPY into a fresh venv
#     (--system-site-packages): from /, `import stoke` is the venv's, its libstoke is the one
#     beside the extension (no LD_LIBRARY_PATH), a small load, python -m stoke, build_info;
#     pip show; pip uninstall -y leaves no file;
#  3. the same with --user (PYTHONUSERBASE in the scratch directory), then uninstalled;
#  4. python3 -m build --wheel --no-isolation: the wheel holds libstoke, RUNPATH $ORIGIN only,
#     the stubs; installed into another fresh venv, the Python tests run from a directory
#     outside the tree against it (all of tests/python but the launcher and exit tests).
# Usage: check.sh SOURCE_DIR [PYTHON]   (env: STOKE_CLI, STOKE_BUILD_FEATURES, STOKE_TEST_TMP)
# A missing prerequisite (python3-venv, python3-build) skips (77), except under CI=true.
set -eu
root=$(cd "$1" && pwd)
py=${2:-/usr/bin/python3}
base=${STOKE_TEST_TMP:-${TMPDIR:-/tmp}}
mkdir -p "$base"
tmp=$(mktemp -d "$base/packaging.XXXXXX")
keep=${STOKE_PACKAGING_KEEP:-}
trap '[ -n "$keep" ] || rm -rf "$tmp"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
unset PYTHONPATH LD_LIBRARY_PATH PYTHONUSERBASE MYPYPATH
t0=$(date +%s)
step() { echo "--- $* ($(($(date +%s) - t0)) s)"; }
fail() { echo "packaging: FAIL: $*" >&2; exit 1; }
skip() {
    [ "${CI:-}" = true ] && fail "$* (CI=true: a prerequisite may not be missing)"
    echo "SKIP: $*"
    exit 77
}
# runs "$@" with its output in $tmp/log, shown only when it fails
quiet() { "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; fail "$*"; }; }

"$py" -c 'import ensurepip, venv' 2>/dev/null || skip "$py has no venv/ensurepip (python3-venv)"
"$py" -c 'import build' 2>/dev/null || skip "$py has no build module (python3-build)"

step "a clean copy of the tree"
mkdir "$tmp/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$root" ls-files -z --cached --others --exclude-standard |
        tar -C "$root" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$tmp/src" -xf -
else
    (cd "$root" && tar --exclude='./build*' --exclude=./.git -cf - .) | tar -C "$tmp/src" -xf -
fi
[ -f "$tmp/src/pyproject.toml" ] || fail "the copy has no pyproject.toml"
[ ! -e "$tmp/src/build" ] || fail "the copy holds a build/ directory"

# check_installed PYTHON WHERE: from /, stoke is the one under WHERE, with its own libstoke,
# and loads; python -m stoke runs; build_info says what CMake found.
check_installed() {
    (cd / && env -u LD_LIBRARY_PATH -u PYTHONPATH "$1" - "$2" "${STOKE_BUILD_FEATURES-}" <<'EOF'
import json, os, subprocess, sys
import stoke
where, features = os.path.realpath(sys.argv[1]), sys.argv[2]
pkg = os.path.dirname(os.path.realpath(stoke.__file__))
assert pkg.startswith(where + os.sep), "stoke imported from %s, not under %s" % (pkg, where)
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libstoke.so" in l}
assert libs == {os.path.join(pkg, "libstoke.so.0")}, "libstoke mapped from %s" % libs
loader = stoke.DataLoader("synthetic:100,shape=4", batch_size=10, shuffle=True, seed=3,
                          num_workers=2, pin_memory=False)
seen = sorted(i for b in loader for i in memoryview(b.indices).tolist())
assert seen == list(range(100)), "the load delivered %s" % seen
info = stoke.build_info()
on = {k for k in ("liburing", "libjpeg", "libcurl", "check_invariants", "zlib") if info[k]}
if features or os.environ.get("STOKE_BUILD_FEATURES") is not None:
    assert on == set(filter(None, features.split(","))), "built in %s, CMake: %r" % (on, features)
assert info["simdev_plugin"] and info["simdev_plugin"].startswith(pkg), info
out = subprocess.run([sys.executable, "-m", "stoke", "devices", "--json"], check=True,
                     capture_output=True, text=True, cwd="/").stdout
assert any(b["name"] == "cpu" for b in json.loads(out)["backends"]), out
print("  stoke %s from %s, libstoke beside it, features %s" % (stoke.version, pkg, sorted(on)))
EOF
    ) || fail "the installed package ($1) does not work from /"
}

# check_gone PYTHON SITE: no stoke file left in SITE, and import stoke fails
check_gone() {
    left=$(find "$2" -maxdepth 1 -iname '*stoke*' 2>/dev/null)
    [ -z "$left" ] || fail "pip uninstall left: $left"
    (cd / && ! "$1" -c 'import stoke' 2>/dev/null) || fail "import stoke works after uninstall"
}

step "pip install --no-build-isolation into a fresh venv"
quiet "$py" -m venv --system-site-packages "$tmp/venv-pip"
vpy="$tmp/venv-pip/bin/python"
quiet "$vpy" -m pip install --no-build-isolation --no-index --no-cache-dir \
    --config-settings "build-dir=$tmp/cmake" "$tmp/src"
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
check_installed "$vpy" "$site"
# the `stoke` command pip put beside the venv's python: the C tool's, as python -m stoke
out=$("$tmp/venv-pip/bin/stoke" version) || fail "the venv's stoke command: $out"
case "$out" in *stoke*) ;; *) fail "the venv's stoke version said: $out" ;; esac
"$tmp/venv-pip/bin/stoke" no-such-command >/dev/null 2>&1 && fail "stoke no-such-command: exit 0"
ver=$("$vpy" -m pip show stoke | sed -n 's/^Version: //p')
want=$(sed -n 's/^#define STOKE_VERSION_STRING "\(.*\)"/\1/p' "$root/include/stoke/version.h")
[ "$ver" = "$want" ] || fail "pip show stoke: version '$ver', not '$want'"
quiet "$vpy" -m pip uninstall -y stoke
check_gone "$vpy" "$site"
[ ! -e "$tmp/venv-pip/bin/stoke" ] || fail "pip uninstall left the venv's stoke command"

step "pip install --user (PYTHONUSERBASE=$tmp/user)"
export PYTHONUSERBASE="$tmp/user"
# Debian marks its Python externally managed (PEP 668): --user needs --break-system-packages
quiet "$py" -m pip install --user --break-system-packages --no-build-isolation --no-index \
    --no-cache-dir --config-settings "build-dir=$tmp/cmake" "$tmp/src"
usite=$("$py" -c 'import site; print(site.getusersitepackages())')
check_installed "$py" "$usite"
quiet "$py" -m pip uninstall -y --break-system-packages stoke
check_gone "$py" "$usite"
unset PYTHONUSERBASE

step "python3 -m build --wheel --no-isolation"
(cd "$tmp/src" && quiet "$py" -m build --wheel --no-isolation --outdir "$tmp/dist" .)
set -- "$tmp"/dist/stoke-*.whl
[ $# = 1 ] && [ -f "$1" ] || fail "python3 -m build made no single wheel: $*"
wheel=$1
"$py" - "$wheel" <<'EOF' || fail "the wheel's contents"
import os, subprocess, sys, tempfile, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
ext = [n for n in names if n.startswith("stoke/_stoke.") and n.endswith(".so")]
for need in ("stoke/__init__.py", "stoke/__main__.py", "stoke/__init__.pyi", "stoke/py.typed",
             "stoke/libstoke.so.0", "stoke/plugins/libstoke-backend-simdev.so"):
    assert need in names, "the wheel has no %s: %s" % (need, sorted(names))
assert len(ext) == 1, ext
with tempfile.TemporaryDirectory() as d:
    p = z.extract(ext[0], d)
    dyn = subprocess.run(["readelf", "-d", p], capture_output=True, text=True, check=True).stdout
runpath = [l.split("[", 1)[1].rstrip("]") for l in dyn.splitlines() if "RUNPATH" in l or "RPATH" in l]
assert runpath == ["$ORIGIN"], "the extension's RUNPATH is %s, not $ORIGIN alone" % runpath
print("  %s: %d files, RUNPATH $ORIGIN" % (os.path.basename(sys.argv[1]), len(names)))
EOF

step "the wheel in another fresh venv, the Python tests from outside the tree"
quiet "$py" -m venv --system-site-packages "$tmp/venv-wheel"
wpy="$tmp/venv-wheel/bin/python"
quiet "$wpy" -m pip install --no-index --no-cache-dir "$wheel"
wsite=$("$wpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
check_installed "$wpy" "$wsite"
mkdir "$tmp/tests" "$tmp/run" "$tmp/test-tmp"
cp -r "$root"/tests/python/*.py "$root/tests/python/typing" "$tmp/tests/"
simdev=$("$wpy" -c 'import stoke; print(stoke.build_info()["simdev_plugin"])')
# Not here: the exit, launcher, lifetime and drop-in process tests (process exits, torchrun,
# mpirun, killed workers, signals, a mount namespace), slow and about processes rather than
# the package, and the remote ones and test_tar_stream (they take tests/remote's helpers, and
# the remote ones start nginx and s3rver from there); python_* runs them against the build tree.
passed=0 skipped=""
for t in "$tmp"/tests/test_*.py; do
    name=$(basename "$t" .py)
    case "$name" in
    test_exit_torch | test_torchrun | test_mpirun | test_lifetime | test_dropin_procs | \
        test_dropin_shm | test_remote* | test_tar_stream) continue ;;
    esac
    rc=0
    (cd "$tmp/run" && env PYTHONPATH="$tmp/tests" STOKE_SIMDEV_PLUGIN="$simdev" \
        STOKE_TEST_TMP="$tmp/test-tmp" STOKE_PLUGIN_PATH= STOKE_ACCELERATOR= OMP_NUM_THREADS=1 \
        "$wpy" "$t") >"$tmp/log" 2>&1 || rc=$?
    case $rc in
    0) passed=$((passed + 1)) ;;
    77) skipped="$skipped $name" ;;
    *) cat "$tmp/log" >&2; fail "$name, run against the installed wheel, exited $rc" ;;
    esac
done
[ "$passed" -gt 0 ] || fail "no Python test passed against the wheel"
echo "  $passed tests passed against the wheel${skipped:+; skipped:$skipped}"
step "done"
