"""Helpers of the Python tests: skips (exit 77, reported by CTest as skipped), data files."""
import os
import sys
import tempfile
import time

SKIP = 77


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def need(*modules):
    """Imports and returns the modules, or skips: the sanitizer build cannot run python, numpy
    or torch missing, or the extension not built."""
    why = os.environ.get("STOKE_PY_SKIP")
    if why:
        skip(why)
    out = []
    for m in modules:
        try:
            out.append(__import__(m))
        except ImportError as e:
            skip("%s is not importable: %s" % (m, e))
    return out[0] if len(out) == 1 else out


def no_forked_python_under_tsan():
    """Skips (exit 77) under ThreadSanitizer: the test needs worker processes forked from this
    multithreaded interpreter that run Python and torch (STOKE_PY_TSAN says why)."""
    why = os.environ.get("STOKE_PY_TSAN")
    if why:
        skip(why)


def sanitizer():
    """The sanitizers the extension was built with ("address,undefined", "thread"), or "":
    under them a test's process runs several times slower, and a test that repeats a case
    for its odds may repeat it fewer times there."""
    return os.environ.get("STOKE_PY_SANITIZER", "")


def is_pinned_fn():
    """A function of a tensor: whether libstoke says its memory is pinned (stoke_is_pinned of
    its data pointer), from the libstoke the extension mapped (an installed wheel's too).
    Call it once stoke is imported."""
    import ctypes
    with open("/proc/self/maps") as f:
        lib = ctypes.CDLL(next(line.split()[-1] for line in f if "libstoke.so" in line))
    lib.stoke_is_pinned.argtypes = [ctypes.c_void_p]
    return lambda t: bool(lib.stoke_is_pinned(t.data_ptr()))


def use_simdev():
    """Makes the simulated accelerator (the simdev plugin) the current one, so that batches
    come from the pinned pool.  Must run before stoke's first call."""
    plugin = os.environ.get("STOKE_SIMDEV_PLUGIN")
    if not plugin or not os.path.exists(plugin):
        skip("the simdev plugin was not built")
    os.environ["STOKE_PLUGIN_PATH"] = plugin
    os.environ["STOKE_ACCELERATOR"] = "simdev"


def tmpdir():
    base = os.environ.get("STOKE_TEST_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix="py_", dir=base)


def make_npy(np, n=64, row_floats=768, seed=1):
    """A .npy of n rows of row_floats float32 (3 KB rows by default) and its labels .npy."""
    d = tmpdir()
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, row_floats)).astype(np.float32)
    labels = (np.arange(n, dtype=np.int64) * 7) % 10
    dp, lp = os.path.join(d, "data.npy"), os.path.join(d, "labels.npy")
    np.save(dp, data)
    np.save(lp, labels)
    return data, labels, dp, lp


def children(reap=False):
    """Pids of this process's live children (zombies left out; with reap, waited for: an
    orphan re-parented to a subreaper that exited)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, ...
        except OSError:
            continue
        if int(fields[1]) != me:
            continue
        if fields[0] != "Z":
            out.append(int(pid))
        elif reap:
            os.waitpid(int(pid), 0)
    return out


def appears(path, within=20.0):
    """Whether the file `path` exists within `within` seconds (polled every 10 ms): a test
    waits on what a worker or child writes, not for a fixed time."""
    deadline = time.monotonic() + within
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
