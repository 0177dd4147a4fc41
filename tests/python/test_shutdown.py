"""A process that leaves a DataLoader over a Python dataset mid-epoch (worker threads calling
__getitem__) exits cleanly: the threads are stopped before the interpreter finalizes."""
import os
import subprocess
import sys

import stoke_testlib as T

T.need("numpy")
CHILD = r"""
import time, numpy as np, stoke
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
    keep.append((loader, it, b))
print("leaving", flush=True)
"""
for mode in ("exit", "del"):
    code = CHILD + ("\nkeep.clear()\n" if mode == "del" else "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    T.check(r.returncode == 0 and "leaving" in r.stdout,
            "%s: exit %d: %s %s" % (mode, r.returncode, r.stdout, r.stderr))
    T.check("Fatal" not in r.stderr and "Traceback" not in r.stderr, "%s: %s" % (mode, r.stderr))
print("ok")
