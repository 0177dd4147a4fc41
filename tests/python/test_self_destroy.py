"""A threads-mode loader that the user's code keeps in a reference cycle (loader.me = loader) is
collected by the cyclic GC on one of its OWN worker threads (__getitem__ runs gc.collect(), as
any allocation may).  That thread cannot join itself: the destroy is deferred to the main
thread (a pending call), or to the exit hook when the interpreter exits first.  Each case runs in
a child process: before the deferral, 1 worker aborted ("loader destroyed on its own worker
thread") and 2 could hang at exit.

Deterministic: every batch after batch 0 blocks (once batch 0's samples were fetched: worker
threads fill one batch at a time, so a batch blocked before that would hold batch 0 back) until
the main thread has taken batch 0 and dropped its references; then the first to wake collects
the cycle."""
import os
import subprocess
import sys

import stoke_testlib as T

CHILD = r'''
import atexit, gc, sys, threading, time, weakref

def stats_at_exit():  # registered before stoke's exit hook: atexit runs it after that one
    print("exit stats", *reap_stats(), flush=True)
atexit.register(stats_at_exit)

import numpy as np
import stoke
from stoke import _stoke
reap_stats = getattr(_stoke, "_reap_stats", lambda: (-1, -1))  # (deferred, destroyed)

mode, nworkers, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gc.disable()  # only the workers' gc.collect() runs the collector (the main thread's would not defer)
main = threading.main_thread()
BS = 4

def thread_name():
    try:
        with open("/proc/self/task/%d/comm" % threading.get_native_id()) as f:
            return f.read().strip()
    except OSError:
        return "?"

class DS:
    def __init__(self):
        self.blocked = threading.Event()
        self.dropped = threading.Event()
        self.first = threading.Event()  # batch 0's samples were all fetched
        self.freed_on = []
    def __len__(self): return 64 * BS
    def __getitem__(self, i):
        if i == BS - 1:
            self.first.set()
        # worker threads fill one batch at a time (the drop-in's fill lock): a batch blocking
        # before batch 0 was made would keep batch 0 from being made at all
        if i >= BS and threading.current_thread() is not main and self.first.is_set():
            self.blocked.set()
            self.dropped.wait(30)
            alive = ref() is not None
            gc.collect()
            if alive and ref() is None:
                self.freed_on.append(thread_name())
        return np.full(3, i, dtype=np.int32)

base = stoke.pinned_stats()["bytes_in_use"]
for rep in range(reps):
    ds = DS()
    loader = stoke.DataLoader(ds, batch_size=BS, num_workers=nworkers, worker_mode="threads",
                              prefetch_factor=2)
    ref = weakref.ref(loader)
    loader.me = loader
    it = iter(loader)
    b = next(it)
    assert b.tolist() == [[i] * 3 for i in range(BS)], b
    deferred0 = reap_stats()[0]
    assert ds.blocked.wait(30), "no worker came to its second batch"
    del loader, it, b
    ds.dropped.set()
    if mode == "exit":
        break  # the interpreter exits while the worker collects the loader
    t0 = time.monotonic()
    while reap_stats()[1] <= deferred0 and time.monotonic() - t0 < 20:
        time.sleep(0.01)  # the main thread runs bytecode: the pending call runs here
    print("rep", rep, "freed on", ds.freed_on, "stats", *reap_stats(), flush=True)
    assert ref() is None, "the loader was not collected"
    in_use = stoke.pinned_stats()["bytes_in_use"]
    assert in_use == base, "pinned memory not returned: %d bytes, %d before" % (in_use, base)
print("ok", flush=True)
'''

T.need("numpy", "torch")
for nworkers in (1, 2):
    for mode, reps in (("wait", 4), ("exit", 1)):
        what = "%d worker(s), %s" % (nworkers, mode)
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, mode, str(nworkers), str(reps)],
                               capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired as e:
            T.check(False, "%s: hung (30 s): %s %s" % (what, e.stdout, e.stderr))
        out = p.stdout.splitlines()
        print(what, "->", p.returncode, out)
        T.check(p.returncode == 0, "%s: exit %d\n%s\n%s" % (what, p.returncode, p.stdout,
                                                             p.stderr))
        T.check("ok" in out, "%s: no ok: %s" % (what, p.stdout))
        T.check(out[-1].startswith("exit stats"), "%s: no exit stats: %s" % (what, p.stdout))
        deferred, reaped = map(int, out[-1].split()[2:])
        T.check(deferred == reaped,
                "%s: %d loaders deferred, %d destroyed by exit" % (what, deferred, reaped))
        if mode == "wait":
            # every rep: collected on a worker thread, destroyed on the main thread before exit
            freed = [line for line in out if line.startswith("rep ")]
            T.check(len(freed) == reps and all("'stoke-w" in line for line in freed),
                    "%s: not every loader was freed on its own worker: %s" % (what, freed))
            T.check(deferred == reps, "%s: %d destroys deferred, %d reps" % (what, deferred, reps))
        else:
            T.check(deferred == 1, "%s: %d destroys deferred" % (what, deferred))
print("ok")
