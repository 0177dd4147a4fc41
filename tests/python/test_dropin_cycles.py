"""A DataLoader over a Python dataset that is part of a reference cycle is collected by the
cyclic GC, its worker processes ended: a dataset that keeps its loader, a trainer whose bound
method is the collate_fn and that keeps the loader and an iterator of it, an iterator kept on
its own loader, a generator over the loader kept on it, a batch kept on its loader (or by a
trainer that holds the loader, or in a generator kept on the loader).  The references the C
loader holds (to the batch writer, which holds the dataset and collate_fn), a C iterator's
reference to its loader and a batch's to its loader were invisible to the GC, so such a cycle
was never freed: a sweep that made a trainer per trial kept every trial's worker processes,
shared memory and descriptors until exit.  A batch's tensor kept after its loader went keeps
its memory, not the loader or its workers."""
import gc
import os
import time
import warnings
import weakref

import stoke_testlib as T

T.no_forked_python_under_tsan()
np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402


def children():
    return len(T.children())


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(4, i, dtype=np.float32)


class Trainer:
    def __init__(self, w):
        self.loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w, collate_fn=self.collate)

    def collate(self, b):
        return torch.utils.data.default_collate(b)


def dataset_keeps_loader(w):
    ds = DS()
    # (set after the workers forked: told once, docs/python.md; not what this test is about)
    warnings.filterwarnings("ignore", "stoke: the dataset's 'loader' changed")
    ds.loader = stoke.DataLoader(ds, batch_size=4, num_workers=w)
    T.check(next(iter(ds.loader))[:, 0].tolist() == [0, 1, 2, 3], "batch 0")
    return ds.loader


def trainer_collate_and_iterator(w):
    t = Trainer(w)
    t.it = iter(t.loader)
    T.check(next(t.it)[:, 0].tolist() == [0, 1, 2, 3], "batch 0")
    return t.loader


def iterator_on_loader(w):
    loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)
    loader.it = iter(loader)
    next(loader.it)
    return loader


def batch_on_loader(w):
    # (the batch's tensors hold its memory through their storages, which the GC cannot see
    # through: before 2026-12-07 that hold was on the loader itself, and this cycle lived on)
    loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)
    loader.last = next(iter(loader))
    return loader


def trainer_keeps_batch(w):
    t = Trainer(w)
    t.batch = next(iter(t.loader))
    return t.loader


def generator_holding_batch(w):
    loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)

    def batches():
        for b in loader:
            yield b[:, 0]
    loader.gen = batches()
    next(loader.gen)
    return loader


def generator_on_loader(w):
    loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)

    def batches():
        yield from loader
    loader.gen = batches()
    next(loader.gen)
    return loader


def workers_end(what):
    """Fails unless the worker processes are back to `base` within 10 s."""
    end = time.monotonic() + 10
    while children() > base and time.monotonic() < end:
        time.sleep(0.02)
    T.check(children() == base, "%s: %d worker process(es) left" % (what, children() - base))


for w in (0, 2):  # (what a first loader sets up for the process is not counted)
    list(stoke.DataLoader(DS(), batch_size=4, num_workers=w))
gc.collect()
base = children()
fds = len(os.listdir("/proc/self/fd"))
for w in (0, 2):
    for case in (dataset_keeps_loader, trainer_collate_and_iterator, iterator_on_loader,
                 generator_on_loader, batch_on_loader, trainer_keeps_batch,
                 generator_holding_batch):
        what = "%s, num_workers=%d" % (case.__name__, w)
        gone = []
        for _ in range(3):
            gone.append(weakref.ref(case(w)))
        gc.collect()
        T.check(not any(r() is not None for r in gone),
                "%s: a loader in a reference cycle was not collected by gc.collect()" % what)
        workers_end(what + ", after the collection")
        now = len(os.listdir("/proc/self/fd"))
        T.check(now <= fds, "%s: %d descriptors open, %d before" % (what, now, fds))
        print("ok", what)



# A batch's tensor kept after its loader went (in a cycle through a batch or not): the loader
# is freed and its workers end at once, as torch's; the tensor keeps its values (its block stays
# mapped) and stays writable until it goes.  Before 2026-12-07 the tensor kept the loader, its
# dataset and its worker processes.
for w in (0, 2):
    for cycle in (False, True):
        what = "a tensor kept, num_workers=%d%s" % (w, ", the loader in a cycle" if cycle else "")
        loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)
        it = iter(loader)
        kept = [next(it) for _ in range(3)]
        if cycle:
            loader.last = kept.pop()
        gone = weakref.ref(loader)
        del loader, it
        if cycle:
            gc.collect()
        T.check(gone() is None, "%s: the loader was not freed" % what)
        workers_end(what)
        for k, b in enumerate(kept):
            T.check(b.tolist() == [[4 * k + j] * 4 for j in range(4)],
                    "%s: batch %d changed after its loader went: %s" % (what, k, b.tolist()))
            b.add_(1)
            T.check(b[:, 0].tolist() == [4 * k + j + 1 for j in range(4)],
                    "%s: batch %d not writable" % (what, k))
        del kept, b
        gc.collect()
        now = len(os.listdir("/proc/self/fd"))
        T.check(now <= fds, "%s: %d descriptors open, %d before" % (what, now, fds))
        print("ok", what)
print("ok")
