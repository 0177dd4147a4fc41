"""A Python dataset that reseeds torch's global RNG per item (torch.manual_seed(i) then draws,
as torchvision's FakeData does) delivers exactly ds[i] for every sample -- what
torch.utils.data.DataLoader delivers for it -- with 2 worker processes (each its own RNG), 2
and 3 worker threads (__getitem__ calls run one at a time: before, 24-210 of 512 labels
differed, the threads' seed-and-draw sequences interleaving) and in the caller's thread.
Threads sharing the interpreter give one stoke.ThreadsWarning per process (2 or more threads;
none for processes, one thread or none).  Where __getitem__ runs: in worker processes only
(never this process, not even at construction); with worker_mode="threads" and num_workers=1
in one thread that is not the caller's; with num_workers=0 in the caller's thread, batch 0's
samples at construction (kept for the first next(), each sample fetched once an epoch)."""
import os
import threading
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import stoke  # noqa: E402

N = 512


class Reseeding:
    """torch.manual_seed(i) + torch.randint per item."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        torch.manual_seed(i)
        x = torch.randint(0, 1 << 30, (16,))
        y = torch.randint(0, 1000, (1,))[0]
        return x, y


class FakeDataLike:
    """torchvision.datasets.FakeData's __getitem__ (without torchvision): the global RNG saved,
    reseeded with the index, drawn from, restored."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        state = torch.get_rng_state()
        torch.manual_seed(i)
        img = torch.randn(3, 8, 8)
        target = torch.randint(0, 10, size=(1,), dtype=torch.long)[0]
        torch.set_rng_state(state)
        return img, target


MODES = ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "threads"},
         {"num_workers": 3, "worker_mode": "threads"}, {"num_workers": 0})


def check_exact(ds, **kw):
    ref = [[t.clone() for t in b] for b in TorchLoader(ds, batch_size=8)]
    T.check(all(torch.equal(ref[k][0][j], ds[8 * k + j][0]) for k in (0, 63) for j in range(8)),
            "torch's batches are not ds[i]")
    loader = stoke.DataLoader(ds, batch_size=8, pin_memory=False, **kw)
    got = [[t.clone() for t in b] for b in loader]
    T.check(len(got) == len(ref) == N // 8, "%s: batches %d" % (kw, len(got)))
    bad = [8 * k + j for k in range(len(ref)) for j in range(8)
           if not (torch.equal(got[k][0][j], ref[k][0][j])
                   and torch.equal(got[k][1][j], ref[k][1][j]))]
    if bad:
        FAILED.append("%s %s: %d of %d samples differ from ds[i], e.g. %s"
                      % (type(ds).__name__, kw, len(bad), N, bad[:8]))


FAILED = []  # every mode is checked before the test fails
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    # no ThreadsWarning for processes, one thread or the caller's thread ...
    for kw in ({"num_workers": 2}, {"num_workers": 1, "worker_mode": "threads"},
               {"num_workers": 0, "worker_mode": "threads"}):
        stoke.DataLoader(Reseeding(), batch_size=8, pin_memory=False, **kw)
    T.check(not [x for x in w if issubclass(x.category, stoke.ThreadsWarning)],
            "a ThreadsWarning without 2 threads: %s" % [str(x.message) for x in w])
    for kw in MODES:
        check_exact(Reseeding(), **kw)
        check_exact(FakeDataLike(), **kw)
# ... one in the process for 2 or more threads, at the first such loader
mine = [str(x.message) for x in w if issubclass(x.category, stoke.ThreadsWarning)]
T.check(len(mine) == 1, "ThreadsWarnings: %s" % mine)
T.check(issubclass(stoke.ThreadsWarning, RuntimeWarning), "not a RuntimeWarning")
T.check("Reseeding" in mine[0] and "2 worker threads" in mine[0], mine[0])


class Where:
    """Each sample is (index, pid, thread ident) of the __getitem__ call; this process's calls
    are also recorded in `idents`."""

    def __init__(self):
        self.idents = set()
        self.calls = []

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if os.getpid() == ME:
            self.idents.add(threading.get_ident())
            self.calls.append(i)
        return i, os.getpid(), threading.get_ident()


ME = os.getpid()
MAIN = threading.get_ident()
for kw in ({"num_workers": 2}, {"num_workers": 1, "worker_mode": "threads"},
           {"num_workers": 0}):
    ds = Where()
    loader = stoke.DataLoader(ds, batch_size=4, pin_memory=False, **kw)
    if kw["num_workers"]:
        T.check(not ds.idents, "%s: construction called __getitem__ in this process" % kw)
    else:  # batch 0, in this thread (torch's first next() would), kept for the iteration
        T.check(ds.idents == {MAIN} and ds.calls == [0, 1, 2, 3],
                "%s: construction's __getitem__ calls %s, threads %s" % (kw, ds.calls,
                                                                        ds.idents))
    idx, pids, tids = [], set(), set()
    for i, pid, tid in loader:
        idx += i.tolist()
        pids.update(pid.tolist())
        tids.update(tid.tolist())
    T.check(idx == list(range(256)), "%s: indices %s" % (kw, idx[:16]))
    if kw["num_workers"] == 0:
        T.check(ds.calls == list(range(256)), "%s: __getitem__ calls %s (each index once)"
                % (kw, ds.calls[:16]))
    if kw.get("worker_mode") is None and kw["num_workers"] > 0:
        T.check(ME not in pids and 1 <= len(pids) <= 2 and not ds.idents,
                "%s: __getitem__ in pids %s (this one %d)" % (kw, pids, ME))
    else:
        T.check(pids == {ME} and tids == ds.idents and len(tids) == 1
                and (MAIN in tids) == (kw["num_workers"] == 0),
                "%s: __getitem__ ran in pids %s on %d thread(s), main thread %s"
                % (kw, pids, len(tids), MAIN in tids))
T.check(not FAILED, "\n  ".join(["samples that are not ds[i]:"] + FAILED))
print("ok")
