"""The drop-in's block sizing and source strings as torch's structure: a batch larger than its
block (max_batch_bytes too small) is made once, by its worker, in memory of its own, with one
RuntimeWarning naming the size to pass, and equals torch's batch (each sample fetched once, in
a worker; the collate_fn called once; an IterableDataset's growing batches too); a worker gone
before its spilled batch is read; structure="list"/"dict" give a source string's fields as
tensors viewing the batch."""
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402


class Ragged:
    """int64 rows of 1..200 values, padded by a collate_fn: batch sizes vary 1..40 x."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.arange(1 + (i * 37) % 200, dtype=torch.int64) + i


def pad(batch):
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=-1)


ref = ref_ragged = [b.clone() for b in torch.utils.data.DataLoader(Ragged(), batch_size=8,
                                                                  collate_fn=pad)]
for workers in (0, 2):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [b.clone() for b in stoke.DataLoader(Ragged(), batch_size=8, num_workers=workers,
                                                   collate_fn=pad, max_batch_bytes=4096)]
    T.check(len(got) == len(ref), "workers=%d: %d batches, torch %d" % (workers, len(got),
                                                                     len(ref)))
    for k, (g, r) in enumerate(zip(got, ref)):
        T.check(torch.equal(g, r), "workers=%d: batch %d differs from torch's" % (workers, k))
    over = [str(x.message) for x in w if "more than a block" in str(x.message)]
    T.check(len(over) == 1 and "max_batch_bytes=" in over[0],
            "workers=%d: the oversize warning, once: %s" % (workers, over))


# --- a batch that outgrows its block is made once, in its worker (spilled) ---------------------
# (a map-style one was made again in the caller's process: each sample fetched twice, the
# second time outside any worker; an IterableDataset's failed with a LoaderError)
import gc  # noqa: E402
import mmap  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)
WORKERS = (0, 2) if PROCS else (0,)


class Counted:
    """Images of 3x32x32 (12 KiB: a batch of 8 outgrows a 4 KiB block) whose fetches are
    counted in shared memory, and where (1: a worker process, 2: the caller's)."""

    def __init__(self, n):
        self.n = n
        self.mm = mmap.mmap(-1, 16 * n)  # (shared with the forked workers)
        self.counts = np.frombuffer(self.mm, dtype=np.int64, count=n)
        self.where = np.frombuffer(self.mm, dtype=np.int64, count=n, offset=8 * n)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.counts[i] += 1
        self.where[i] = 1 if torch.utils.data.get_worker_info() is not None else 2
        return torch.full((3, 32, 32), float(i)), i


collated = mmap.mmap(-1, 8 * 96)
collate_calls = np.frombuffer(collated, dtype=np.int64)


def counted_pad(batch):  # the user's collate_fn, its calls counted per batch
    collate_calls[batch[0][1]] += 1
    return torch.stack([x for x, _ in batch]), torch.tensor([y for _, y in batch])


def memfds():
    """The memfds of spilled batches open in this process and its descendants (a worker's is
    sent to this process and closed; this process maps it and closes it)."""
    kids = {os.getpid()}
    for _ in range(3):  # (workers are the zygote's children)
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and int(open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1]
                                         .split()[1]) in kids:
                    kids.add(int(pid))
            except OSError:
                pass
    n = 0
    for pid in kids:
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                n += os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("/memfd:stoke-batch")
        except OSError:
            pass
    return n


for workers in WORKERS:
    for collate in (None, counted_pad):
        what = "num_workers=%d collate_fn=%s" % (workers, collate and collate.__name__)
        ds = Counted(96)
        ref = [(x.clone(), y.clone()) for x, y in torch.utils.data.DataLoader(ds, batch_size=8)]
        ds.counts[:] = 0
        collate_calls[:] = 0
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            loader = stoke.DataLoader(ds, batch_size=8, num_workers=workers, collate_fn=collate,
                                      max_batch_bytes=4096, persistent_workers=workers > 0)
            for epoch in range(3):
                got = [(x.clone(), y.clone()) for x, y in loader]
                T.check(len(got) == 12 and all(torch.equal(a, c) and torch.equal(b, d)
                                               for (a, b), (c, d) in zip(got, ref)),
                        "%s epoch %d: the batches differ from torch's" % (what, epoch))
                T.check(ds.counts.tolist() == [epoch + 1] * 96,
                        "%s epoch %d: samples fetched %s times" % (what, epoch,
                                                                   ds.counts.tolist()))
                T.check(set(ds.where.tolist()) == {1 if workers else 2},
                        "%s: samples fetched in %s (1: a worker, 2: the caller)" % (
                            what, set(ds.where.tolist())))
                if collate is not None:
                    T.check(collate_calls[::8].tolist() == [epoch + 1] * 12,
                            "%s: collate_fn called %s times a batch" % (
                                what, collate_calls[::8].tolist()))
                T.check(memfds() == 0, "%s epoch %d: %d spilled batches left open" % (
                    what, epoch, memfds()))
        over = [str(x.message) for x in w if "more than a block" in str(x.message)]
        T.check(len(over) == 1 and "max_batch_bytes=" in over[0],
                "%s: the oversize warning, once: %s" % (what, over))
        del loader, got

# a break leaves spilled batches made and never read: none stays open, at the next pass or
# when the loader goes
if PROCS:
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        loader = stoke.DataLoader(Counted(96), batch_size=8, num_workers=2, max_batch_bytes=4096)
        for k in range(2):
            for x, y in loader:
                break
            time.sleep(0.5)  # (the workers spill the next batches meanwhile)
        del x, y
        n = memfds()
        del loader
        gc.collect()
    T.check(memfds() == 0, "after a break: %d spilled batches open, %d before the loader went"
            % (memfds(), n))



# big samples of fixed shape are streamed into the block's rows as they come; when a later batch's
# samples are bigger, the batch's tensor outgrows the block at its first sample: the rest are
# collated (the first sample of each such batch was fetched again in the spill)
class Growing2D(Counted):
    def __getitem__(self, i):
        self.counts[i] += 1
        side = 128 if i < 32 else 256  # 192 KiB, then 768 KiB a sample
        return {"img": torch.full((3, side, side), float(i)), "y": i}


for workers in WORKERS:
    ds = Growing2D(64)
    ref = [(b["img"].clone(), b["y"].clone()) for b in torch.utils.data.DataLoader(ds, batch_size=4)]
    ds.counts[:] = 0
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = [(b["img"].clone(), b["y"].clone())
               for b in stoke.DataLoader(ds, batch_size=4, num_workers=workers)]
    # (with workers, sample 0 is fetched once more at construction, in the child that
    # measures the block)
    T.check(ds.counts.tolist() == [1 + (workers > 0)] + [1] * 63, "rows, num_workers=%d: "
            "fetched %s times" % (workers, ds.counts.tolist()))
    T.check(len(got) == 16 and all(torch.equal(a, c) and torch.equal(b, d)
                                   for (a, b), (c, d) in zip(got, ref)),
            "rows, num_workers=%d: the batches differ from torch's" % workers)

# many spilled batches in flight while the first is slow: their memfds (one socket then) filled
# the queue, the first batch's worker waited to send its own, and the caller waited for it
class SlowFirst:
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i < 2:
            time.sleep(1)
        return torch.full((4096,), float(i))


if PROCS:
    import faulthandler  # noqa: E402
    faulthandler.dump_traceback_later(90, exit=True)  # (a hang fails the test, with stacks)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = [int(b[0, 0]) for b in stoke.DataLoader(SlowFirst(), batch_size=2, num_workers=4,
                                                      prefetch_factor=100, max_batch_bytes=4096)]
    faulthandler.cancel_dump_traceback_later()
    T.check(got == list(range(0, 1000, 2)), "a slow first batch, 400 spilled batches in flight: "
            "%d batches" % len(got))

class Growing(torch.utils.data.IterableDataset):
    """Rows of 1, 2, ... 64 int64 values (each worker its share): padded batches grow 60x."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        return (torch.arange(1 + i, dtype=torch.int64) for i in range(64) if i % n == k)


def rows(batches):
    return sorted(tuple(r.tolist()) for b in batches for r in b)


for workers in WORKERS:
    ref = rows(torch.utils.data.DataLoader(Growing(), batch_size=4, collate_fn=pad,
                                           num_workers=workers))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = rows(stoke.DataLoader(Growing(), batch_size=4, collate_fn=pad,
                                    num_workers=workers))
    T.check(got == ref and len(got) == 64, "IterableDataset, num_workers=%d: %d rows, torch's "
            "%d, equal: %s" % (workers, len(got), len(ref), got == ref))

# a worker killed after it spilled a batch, before the caller reads it: the batch comes (its
# memory was sent, in flight, not held by the worker), and one it was making is made again (a
# batch whose worker was killed is retried once)
if PROCS:
    from stoke import _dropin  # noqa: E402

    def dead(pid):
        try:
            return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] in "ZX"
        except OSError:
            return True

    killed = []
    take = _dropin._Writer.take_spill

    def kill_first(self, b, view):
        pid = _dropin._SPILL.unpack_from(view, 0)[1]
        if not killed:
            killed.append(pid)
            os.kill(pid, 9)
            while not dead(pid):
                time.sleep(0.01)
        return take(self, b, view)

    _dropin._Writer.take_spill = kill_first
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            loader = stoke.DataLoader(Counted(48), batch_size=8, num_workers=2,
                                      max_batch_bytes=4096)
            got = [int(y[0]) for _, y in loader]
    finally:
        _dropin._Writer.take_spill = take
    T.check(len(killed) == 1 and got == list(range(0, 48, 8)),
            "a worker killed after it spilled: batches %s" % got)
    del loader

data, labels, dp, lp = T.make_npy(np, n=40, row_floats=12)
for structure in ("list", "dict"):
    loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=8, num_workers=0,
                              structure=structure)
    seen = 0
    for b in loader:
        x, y = (b["data"], b["label"]) if structure == "dict" else b
        T.check(isinstance(x, torch.Tensor) and x.shape[1:] == (12,), "%s: %r" % (structure, x))
        T.check(np.array_equal(x.numpy(), data[seen:seen + len(y)])
                and np.array_equal(y.numpy(), labels[seen:seen + len(y)]),
                "%s: rows differ from the .npy at %d" % (structure, seen))
        seen += len(y)
    T.check(seen == 40, "%s: %d samples" % (structure, seen))
try:
    stoke.DataLoader("npy:%s" % dp, structure="tuple")
    T.check(False, "structure='tuple' accepted")
except ValueError as e:
    T.check("structure must be" in str(e), str(e))


class SlowInChild:
    """Sample i = tensor([i]); in any process but this one __getitem__ never returns (a child
    forked while another thread held a lock it needs would hang the same way)."""
    main = None

    def __len__(self):
        return 10

    def __getitem__(self, i):
        import os
        import time
        while os.getpid() != SlowInChild.main:
            time.sleep(1)
        return torch.tensor([i])


import os  # noqa: E402
import time  # noqa: E402
from stoke import _dropin  # noqa: E402

SlowInChild.main = os.getpid()
_dropin._PROBE_TIMEOUT_S = 1
# with workers the first batch is measured in a forked child (one worker thread here, so that
# the batches themselves are made in this process); with none, here: no child to hang
for kw, probed in (({"num_workers": 1, "worker_mode": "threads"}, True),
                   ({"num_workers": 0}, False)):
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = stoke.DataLoader(SlowInChild(), batch_size=4, **kw)
    slow = [str(x.message) for x in w if "measuring the first batch" in str(x.message)]
    T.check(len(slow) == int(probed) and all("max_batch_bytes" in m for m in slow),
            "%s: a hung probe: warnings %s" % (kw, slow))
    T.check(time.monotonic() - t0 < 30,
            "%s: the constructor took %.1f s" % (kw, time.monotonic() - t0))
    got = [b.view(-1).tolist() for b in loader]
    T.check(got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], "%s: after the probe: %s" % (kw, got))
    del loader
print("ok")
