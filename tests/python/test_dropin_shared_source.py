"""An IterableDataset that reads a source shared with the caller's process (a
multiprocessing.Queue, a file object opened in __init__) gives every item once, as torch's
DataLoader does, with num_workers 0, 1 and 2: nothing runs the dataset before iteration starts
(a child forked at construction to measure the first batch consumed it: 100 queued items gave
90, 2000 lines 140), and a loader made before its queue is filled is made at once (it waited
60 s for the child, then hung on the queue's lock the killed child held).  A map dataset with
num_workers=0 and a sampler object is never called in a forked child (it was, to measure)."""
import multiprocessing as mp
import os
import warnings

import stoke_testlib as T

T.no_forked_python_under_tsan()
torch = T.need("torch")
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402
from torch.utils.data import IterableDataset  # noqa: E402

import stoke  # noqa: E402


class FromQueue(IterableDataset):
    """The queue's ints up to a None (each worker stops at one of its own); iterations counts
    the iterators made, in any process (shared memory)."""

    def __init__(self, q):
        self.q = q
        self.iterations = mp.Value("i", 0)

    def __iter__(self):
        with self.iterations.get_lock():
            self.iterations.value += 1
        while True:
            x = self.q.get(timeout=30)
            if x is None:
                return
            yield x


class Lines(IterableDataset):
    """A file's lines as ints, from the file object opened when the dataset was made."""

    def __init__(self, path):
        self.f = open(path)

    def __iter__(self):
        for line in self.f:
            yield int(line)


def fill(q, n, workers):
    for i in range(n):
        q.put(i)
    for _ in range(max(1, workers)):
        q.put(None)


def items(loader):
    return [x for b in loader for x in b.tolist()]


def from_queue(make, workers, before):
    """The items make(dataset, ...) delivers from a queue of 100 ints filled before the loader
    is made or after; the iterators of the dataset made before the loader was iterated."""
    q = mp.Queue()
    if before:
        fill(q, 100, workers)
    ds = FromQueue(q)
    loader = make(ds, batch_size=10, num_workers=workers)
    made = ds.iterations.value
    if not before:
        fill(q, 100, workers)
    return items(loader), made


@case
def queue_filled_before():
    for workers in (0, 1, 2):
        ref, _ = from_queue(L.TorchLoader, workers, True)
        got, _ = from_queue(stoke.DataLoader, workers, True)
        T.check(sorted(ref) == list(range(100)), "torch: %r" % ref)
        T.check(sorted(got) == sorted(ref), "workers=%d: %d items %r, torch %d" % (
            workers, len(got), sorted(got)[:12], len(ref)))
        if workers <= 1:
            T.check(got == ref, "workers=%d: order %r, torch %r" % (workers, got, ref))


@case
def queue_filled_after():
    for workers in (0, 1, 2):
        ref, _ = from_queue(L.TorchLoader, workers, False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, made = from_queue(stoke.DataLoader, workers, False)
        # (the old constructor waited for a child blocked on the empty queue)
        T.check(made == 0, "workers=%d: %d iterators made by the constructor" % (workers, made))
        T.check(not [w for w in caught if "measuring" in str(w.message)],
                "workers=%d: %r" % (workers, [str(w.message) for w in caught]))
        T.check(sorted(got) == sorted(ref) == list(range(100)), "workers=%d: %d items %r" % (
            workers, len(got), sorted(got)[:12]))


@case
def file_opened_in_init():
    path = os.path.join(T.tmpdir(), "shared-source-%d.txt" % os.getpid())
    with open(path, "w") as f:
        for i in range(2000):
            f.write("%d\n" % i)
    try:
        # (two workers read one shared file offset through buffers of their own, torn lines
        # and all: no order to compare)
        for workers in (0, 1):
            ref = items(L.TorchLoader(Lines(path), batch_size=100, num_workers=workers))
            got = items(stoke.DataLoader(Lines(path), batch_size=100, num_workers=workers))
            T.check(ref == list(range(2000)), "torch: %d lines" % len(ref))
            T.check(got == ref, "workers=%d: %d lines, first %r, torch %d" % (
                workers, len(got), got[:1], len(ref)))
    finally:
        os.unlink(path)


class Logged(torch.utils.data.Dataset):
    """Sample i is i; each call appends "pid index" to a file (O_APPEND: a child's show)."""

    def __init__(self, log, n=12):
        self.log, self.n = log, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"%d %d\n" % (os.getpid(), i))
        os.close(fd)
        return i


@case
def map_sampler_object_no_child():
    """num_workers=0 with a sampler object (a DistributedSampler's handle-holding dataset):
    __getitem__ runs in this process only, once a sample (it ran in a forked child first)."""
    log = os.path.join(T.tmpdir(), "shared-source-calls-%d.log" % os.getpid())
    ds = Logged(log)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=1, rank=0,
                                                              shuffle=False)
    ref = items(L.TorchLoader(ds, batch_size=4, sampler=sampler))
    if os.path.exists(log):
        os.unlink(log)
    try:
        got = items(stoke.DataLoader(ds, batch_size=4, sampler=sampler))
        with open(log) as f:
            calls = [tuple(int(v) for v in line.split()) for line in f]
    finally:
        if os.path.exists(log):
            os.unlink(log)
    T.check(got == ref == list(range(12)), "batches %r, torch %r" % (got, ref))
    T.check(calls == [(os.getpid(), i) for i in range(12)],
            "__getitem__ calls (pid, index): %r, this process %d" % (calls, os.getpid()))


L.run_cases()
