"""A DataLoader over a Python dataset that is part of a reference cycle is collected by the
cyclic GC, its worker processes ended: a dataset that keeps its loader, a trainer whose bound
method is the collate_fn and that keeps the loader and an iterator of it, an iterator kept on
its own loader, a generator over the loader kept on it.  The references the C loader holds (to
the batch writer, which holds the dataset and collate_fn) and a C iterator's reference to its
loader were invisible to the GC, so such a cycle was never freed: a sweep that made a trainer
per trial kept every trial's worker processes, shared memory and descriptors until exit."""
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


def generator_on_loader(w):
    loader = stoke.DataLoader(DS(), batch_size=4, num_workers=w)

    def batches():
        yield from loader
    loader.gen = batches()
    next(loader.gen)
    return loader


for w in (0, 2):  # (what a first loader sets up for the process is not counted)
    list(stoke.DataLoader(DS(), batch_size=4, num_workers=w))
gc.collect()
base = children()
fds = len(os.listdir("/proc/self/fd"))
for w in (0, 2):
    for case in (dataset_keeps_loader, trainer_collate_and_iterator, iterator_on_loader,
                 generator_on_loader):
        what = "%s, num_workers=%d" % (case.__name__, w)
        gone = []
        for _ in range(3):
            gone.append(weakref.ref(case(w)))
        gc.collect()
        T.check(not any(r() is not None for r in gone),
                "%s: a loader in a reference cycle was not collected by gc.collect()" % what)
        end = time.monotonic() + 10
        while children() > base and time.monotonic() < end:
            time.sleep(0.02)
        T.check(children() == base, "%s: %d worker process(es) left after the collection"
                % (what, children() - base))
        now = len(os.listdir("/proc/self/fd"))
        T.check(now <= fds, "%s: %d descriptors open, %d before" % (what, now, fds))
        print("ok", what)
print("ok")
