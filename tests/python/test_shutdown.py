"""A process that leaves a DataLoader over a Python dataset mid-epoch (worker threads calling
__getitem__) exits cleanly: the threads are stopped before the interpreter finalizes."""
import os
import subprocess
import sys

import stoke_testlib as T

T.need("numpy")
CHILD = r"""
import sys, time, numpy as np, stoke
class Slow:
    def __len__(self): return 10000
    def __getitem__(self, i):
        time.sleep(0.001)
        return np.full(4, i, dtype=np.int64)
keep = []
for persistent in (False, True):
    loader = stoke.DataLoader(Slow(), batch_size=4, num_workers=2, pin_memory=False,
                              persistent_workers=persistent, prefetch_factor=4)
    it = iter(loader)
    b = next(it)
    assert list(memoryview(b.indices)) == [0, 1, 2, 3]
    keep.append((loader, it, b) if sys.argv[1] == "batch" else (loader, it))
    del b
if sys.argv[1] == "del":
    keep.clear()
print("leaving", flush=True)
"""
# exit:  loaders mid-epoch left to the exit hook, no batch alive: it destroys them (their
#        threads joined: under TSan a thread left unjoined is reported as a leak)
# del:   loaders destroyed by the program mid-epoch
# batch: a batch still alive at exit: the hook only stops the epoch (threads of persistent
#        workers stay, idle: TSan's leak report is off for this case)
for mode in ("exit", "del", "batch"):
    env = dict(os.environ)
    if mode == "batch" and "TSAN_OPTIONS" in env:
        env["TSAN_OPTIONS"] += ":report_thread_leaks=0"
    r = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                       timeout=120, env=env)
    T.check(r.returncode == 0 and "leaving" in r.stdout,
            "%s: exit %d: %s %s" % (mode, r.returncode, r.stdout, r.stderr))
    T.check("Fatal" not in r.stderr and "Traceback" not in r.stderr and "WARNING" not in r.stderr,
            "%s: %s" % (mode, r.stderr))
print("ok")
