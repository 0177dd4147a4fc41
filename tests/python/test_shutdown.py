"""A process that leaves a DataLoader over a Python dataset mid-epoch (workers calling
__getitem__: worker processes, the default, or worker_mode="threads") exits cleanly: exit code
0, nothing on stderr (the one ThreadsWarning of 2 worker threads is caught and checked),
within the time limit; threads are stopped before the interpreter finalizes, and no worker
process outlives it."""
import ctypes
import os
import subprocess
import sys
import time

import stoke_testlib as T

T.no_forked_python_under_tsan()

T.need("numpy", "torch")
CHILD = r"""
import sys, time, warnings, numpy as np, stoke
class Slow:
    def __len__(self): return 10000
    def __getitem__(self, i):
        time.sleep(0.001)
        return np.full(4, i, dtype=np.int64)
mode, workers = sys.argv[1], sys.argv[2]
keep = []
warned = []
for persistent in (False, True):
    with warnings.catch_warnings(record=True) as w:  # 2 threads: a ThreadsWarning, not stderr
        warnings.simplefilter("always")
        loader = stoke.DataLoader(Slow(), batch_size=4, num_workers=2, pin_memory=False,
                                  persistent_workers=persistent, prefetch_factor=4,
                                  worker_mode=workers)
    warned += [x.category for x in w]
    it = iter(loader)
    b = next(it)
    assert b[:, 0].tolist() == [0, 1, 2, 3] and b.shape == (4, 4), b
    b = next(it)
    assert b[:, 0].tolist() == [4, 5, 6, 7], b
    keep.append((loader, it, b) if mode == "batch" else (loader, it))
    del b
assert warned == ([stoke.ThreadsWarning] if workers == "threads" else []), warned
if mode == "del":
    keep.clear()
print("leaving", flush=True)
"""
# a worker process whose parent exited is re-parented here, where it is seen
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def run(what, args, status, env=None):
    """Runs CHILD-like code (args: -c's code and its arguments); checks its exit status, its
    "leaving", an empty stderr, and that no process of it outlives it by 10 s."""
    r = subprocess.run([sys.executable, "-c"] + args, capture_output=True, text=True,
                       timeout=120, env=env)
    T.check(r.returncode == status and "leaving" in r.stdout,
            "%s: exit %d: %s %s" % (what, r.returncode, r.stdout, r.stderr))
    T.check(not r.stderr.strip(), "%s: stderr: %s" % (what, r.stderr))
    end = time.monotonic() + 10
    left = T.children(reap=True)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = T.children(reap=True)
    T.check(not left, "%s: %d process(es) outlived the program by 10 s: %s"
            % (what, len(left), left))


# exit:  loaders mid-epoch left to the exit hook, no batch alive: it destroys them (threads
#        joined: under TSan a thread left unjoined is reported as a leak; workers ended)
# del:   loaders destroyed by the program mid-epoch
# batch: a batch (a tensor viewing pinned memory) still alive at exit: the hook only stops the
#        epoch (threads of persistent workers stay, idle: TSan's leak report is off for this
#        case)
for workers in ("processes", "threads"):
    for mode in ("exit", "del", "batch"):
        env = dict(os.environ)
        if mode == "batch" and "TSAN_OPTIONS" in env:
            env["TSAN_OPTIONS"] += ":report_thread_leaks=0"
        run("%s/%s" % (workers, mode), [CHILD, mode, workers], 0, env)
print("ok")

# A daemon thread iterating a loader (a prefetcher) while the script exits: the exit status is
# the script's, nothing on stderr (with num_workers=0 the thread's next call of the stopped
# dataset raised a LoaderError, whose traceback, cut off by the finalization, was printed on
# the stderr of a script that ended normally; torch's thread is frozen silently), no process
# left; the thread ends (an exit hook registered before stoke's may join it).
DAEMON = r"""
import atexit, sys, threading, time
threads = []
# (registered before stoke's hook, so it runs after it: the thread's end, so its stderr, is
# waited for, where the finalization would otherwise race it)
atexit.register(lambda: [t.join(30) for t in threads])
import numpy as np, stoke
class Slow:
    def __len__(self): return 10000
    def __getitem__(self, i):
        time.sleep(0.002)
        return np.full(4, i, dtype=np.int64)
loader = stoke.DataLoader(Slow(), batch_size=4, num_workers=int(sys.argv[1]), pin_memory=False)
got = threading.Event()
def prefetch():
    for k, b in enumerate(loader):
        if k == 2:
            got.set()
threads.append(threading.Thread(target=prefetch, daemon=True))
threads[0].start()
assert got.wait(60)
print("leaving", flush=True)
sys.exit(3)
"""
for workers in (0, 2):
    run("daemon thread, num_workers=%d" % workers, [DAEMON, str(workers)], 3)
print("ok (daemon thread)")
