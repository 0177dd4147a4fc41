"""worker_mode (issue 12, issue 27): a source string loaded by worker processes gives the same
batches (indices, rows, labels) as worker threads.  A Python dataset with num_workers > 0 is
loaded by worker processes by default (and with worker_mode="processes"): its __getitem__ runs
in child processes, in parallel (each worker's first sample waits at a barrier for the other),
where get_worker_info() names the worker, its seed is torch's for the same generator, and
worker_init_fn ran first -- also when it sets up state that __getitem__ needs; the batches are
torch's DataLoader's.  worker_mode="threads" runs it in this process, the same batches, no child
process.  No process is left after the loader.  An unknown mode is a ValueError."""
import multiprocessing
import os
import subprocess
import sys

import stoke_testlib as T

T.no_forked_python_under_tsan()

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader, get_worker_info  # noqa: E402

import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=150, row_floats=100)
spec = "npy:%s,labels=%s" % (dp, lp)


def children():
    """Processes whose parent is this one (the zygote, in process mode)."""
    me, n = str(os.getpid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % pid) as f:
                n += any(line.split() == ["PPid:", me] for line in f)
        except OSError:
            pass
    return n


def batches(mode):
    out = []
    loader = stoke.DataLoader(spec, batch_size=16, shuffle=True, seed=5, num_workers=2,
                              pin_memory=False, worker_mode=mode)
    for k, b in enumerate(loader):
        if k == 0:
            want = mode == "processes"
            T.check((children() > 0) == want, "%s: %d child processes" % (mode, children()))
        out.append((np.from_dlpack(b.indices).copy(), np.asarray(b["data"]).copy(),
                    np.asarray(b["label"]).copy()))
    del loader
    return out


# processes first: the zygote is forked before this process has any loader thread
proc = batches("processes")
T.check(children() == 0, "child processes left after the loader: %d" % children())
thr = batches("threads")
T.check(len(proc) == len(thr) == 10, "batches %d %d" % (len(proc), len(thr)))
for (pi, pd, pl), (ti, td, tl) in zip(proc, thr):
    T.check(np.array_equal(pi, ti), "order differs: %s %s" % (pi, ti))
    T.check(np.array_equal(pd, td) and np.array_equal(pd, data[pi]), "rows differ at %s" % pi)
    T.check(np.array_equal(pl, tl), "labels differ at %s" % pi)


class Rows:
    """Each sample: (index, pid, worker id, the worker's seed, the row).  In a worker process
    (get_worker_info() set) the first sample waits until every worker has reached its own
    first sample: a worker that ran alone would break the barrier after 30 s.  (The loaders
    below pass max_batch_bytes: without it, construction measures the first batch in a forked
    child of its own, whose first sample would wait at the barrier alone.)"""

    def __init__(self, barrier=None):
        self.barrier = barrier
        self.waited = False

    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and self.barrier is not None and not self.waited:
            self.waited = True
            self.barrier.wait()
        wid, seed = (info.id, info.seed) if info is not None else (-1, -1)
        return i, os.getpid(), wid, seed, data[i]


def py_batches(ds, **kw):
    loader = stoke.DataLoader(ds, batch_size=16, pin_memory=False, **kw)
    out = []
    for k, b in enumerate(loader):
        if k == 0:
            during = children()
        out.append([t.clone() for t in b])
    del loader, b
    return out, during


ref = [[t.clone() for t in b] for b in TorchLoader(Rows(), batch_size=16)]
ME = os.getpid()
for kw in ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "processes"}):
    barrier = multiprocessing.get_context("fork").Barrier(2, timeout=30)
    got, during = py_batches(Rows(barrier), generator=torch.Generator().manual_seed(7),
                             max_batch_bytes=1 << 20, **kw)
    T.check(during > 0, "%s: no child process while loading" % kw)
    T.check(children() == 0, "%s: %d child processes left after the loader" % (kw, children()))
    T.check(len(got) == len(ref) == 10, "%s: batches %d" % (kw, len(got)))
    for (gi, gp, gw, gs, gr), (ri, _, _, _, rr) in zip(got, ref):
        T.check(torch.equal(gi, ri) and torch.equal(gr, rr), "%s: batch %s differs" % (kw, gi))
        T.check(ME not in gp.tolist(), "%s: __getitem__ ran in this process" % kw)
    pids = {int(p) for b in got for p in b[1]}
    T.check(len(pids) == 2, "%s: __getitem__ ran in %d processes (%s)" % (kw, len(pids), pids))
    seeds = {int(w): int(s) for b in got for w, s in zip(b[2], b[3])}
    tseeds = {int(w): int(s) for b in TorchLoader(
        Rows(), batch_size=16, num_workers=2, generator=torch.Generator().manual_seed(7))
        for w, s in zip(b[2], b[3])}
    T.check(seeds == tseeds, "%s: worker seeds %s, torch's %s" % (kw, seeds, tseeds))

# threads: this process, the same batches, no child process
got, during = py_batches(Rows(), num_workers=2, worker_mode="threads")
T.check(during == 0, "threads: %d child processes while loading" % during)
T.check(len(got) == 10 and all(torch.equal(g[0], r[0]) and torch.equal(g[4], r[4])
                               for g, r in zip(got, ref)), "threads: batches differ")
T.check({int(p) for b in got for p in b[1]} == {ME}, "threads: __getitem__ in another process")

for bad, kw in ((Rows(), {"worker_mode": "forks"}), (spec, {"worker_mode": "forks"})):
    try:
        stoke.DataLoader(bad, batch_size=4, num_workers=1, pin_memory=False, **kw)
    except ValueError as e:
        T.check("worker_mode" in str(e), "message: %s" % e)
    else:
        T.check(False, "no ValueError for %s" % kw)


# worker_init_fn sets up what __getitem__ needs (torch's pattern for a file handle opened per
# worker): it runs in each worker before that worker's first sample
class NeedsInit:
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return self.base + i, os.getpid()


def init(wid):
    info = get_worker_info()
    T.check(info is not None and info.id == wid and info.num_workers == 2, "info %s" % info)
    info.dataset.base = 1000 * (wid + 1)


for name, loader_class in (("torch", TorchLoader), ("stoke", stoke.DataLoader)):
    try:
        got = [[t.clone() for t in b] for b in loader_class(NeedsInit(), batch_size=8,
                                                             num_workers=2, worker_init_fn=init)]
    except Exception as e:  # noqa: BLE001
        T.check(False, "%s: worker_init_fn's state: %s: %s" % (name, type(e).__name__, e))
    T.check(len(got) == 4 and all(
        (b[0] - torch.arange(8 * k, 8 * k + 8)).unique().tolist() in ([1000], [2000])
        for k, b in enumerate(got)), "%s: %s" % (name, [b[0].tolist() for b in got]))

# Out of file descriptors (RLIMIT_NOFILE lowered once the loader is made, 30 worker processes to
# start): a worker process whose socket could not be received is an error that says so (it was
# "no descriptor from the worker zygote (STOKE_ENOMEM)"), and the process forked for it is
# reaped at once (each one was a zombie under the zygote until the loader was destroyed).
EMFILE = r"""
import os, resource, sys, time
import stoke
loader = stoke.DataLoader(sys.argv[1], batch_size=64, num_workers=30, worker_mode="processes",
                          pin_memory=False)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
lim = len(os.listdir("/proc/self/fd")) + 3  # (made: the workers' sockets come when they start)
resource.setrlimit(resource.RLIMIT_NOFILE, (lim, hard))
try:
    for b in loader:
        pass
    print("no error")
except stoke.StokeError as e:
    print("error:", e)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # (to read /proc)
print("RLIMIT_NOFILE %d" % lim)


def kids(pid, state=None):
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % p) as f:
                st = dict(l.split(":", 1) for l in f if ":" in l)
        except OSError:
            continue
        if st.get("PPid", "").strip() == str(pid) and (
                state is None or st.get("State", "").split()[0] == state):
            out.append(int(p))
    return out


zygotes = kids(os.getpid())
zombies = None
for _ in range(100):  # (the zygote reaps on its own time: at most 5 s)
    zombies = sum(len(kids(z, "Z")) for z in zygotes)
    if not zombies:
        break
    time.sleep(0.05)
print("zygotes", len(zygotes), "zombies", zombies)
"""
big, _, bp, _ = T.make_npy(np, n=30 * 64 * 4, row_floats=16)
r = subprocess.run([sys.executable, "-c", EMFILE, bp], capture_output=True, text=True,
                   timeout=120)
out = r.stdout + r.stderr
lim = out.split("\nRLIMIT_NOFILE ")[-1].split()[0] if "\nRLIMIT_NOFILE " in out else "?"
T.check("its socket could not be received: this process has too many open files (RLIMIT_NOFILE "
        "%s; ulimit -n)" % lim in out, "EMFILE: %s" % out[-2000:])
T.check("zygotes 1 zombies 0" in out, "EMFILE zombies: %s" % out[-2000:])
print("ok")
