"""A DataLoader subclass that wraps its batch_sampler (its sampler, with batch_size=None) in a
sampler that repeats it for ever and iterates one iter() of the loader across epochs, as
YOLOv5's InfiniteDataLoader (the swap through object.__setattr__) and timm's
MultiEpochsDataLoader (with _DataLoader__initialized set False) do: its epochs are torch's,
each a full pass (the one iterator went on past the first epoch's end: "generator raised
StopIteration" at epoch 2).  Another object put there is refused with a ValueError naming it
(it was ignored: stoke's workers plan from the loader's own order)."""
import os

import stoke_testlib as T

torch = T.need("torch")
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402

import stoke  # noqa: E402

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)
WORKERS = (0, 2) if PROCS else (0,)


class Repeat:
    """The wrapped sampler's passes, one after the other, for ever."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)

    def __len__(self):  # (batch_size=None: the subclass's len() is the sampler's)
        return len(self.sampler)


def infinite(base):
    """The InfiniteDataLoader pattern over loader class base (object.__setattr__)."""

    class Infinite(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "batch_sampler", Repeat(self.batch_sampler))
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    return Infinite


def multi_epochs(base):
    """The MultiEpochsDataLoader pattern over loader class base (the flag set False)."""

    class MultiEpochs(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._DataLoader__initialized = False
            if self.batch_sampler is None:
                self.sampler = Repeat(self.sampler)
            else:
                self.batch_sampler = Repeat(self.batch_sampler)
            self._DataLoader__initialized = True
            self.iterator = super().__iter__()

        def __len__(self):
            if self.batch_sampler is None:
                return len(self.sampler)
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    return MultiEpochs


def epochs(loader, n=3):
    return [[b if type(b) is int else b.tolist() for b in loader] for _ in range(n)]


@case
def infinite_in_order():
    for workers in WORKERS:
        for wrap in (infinite, multi_epochs):
            ref = epochs(wrap(L.TorchLoader)(L.Indices(6), batch_size=2, num_workers=workers))
            got = epochs(wrap(stoke.DataLoader)(L.Indices(6), batch_size=2, num_workers=workers))
            T.check(ref == [[[0, 1], [2, 3], [4, 5]]] * 3, "torch: %r" % ref)
            T.check(got == ref, "%s, workers=%d: %r" % (wrap.__name__, workers, got))


@case
def infinite_shuffled():
    # each epoch a full permutation (stoke's own order, not torch's: docs/python.md)
    for workers in WORKERS:
        for wrap in (infinite, multi_epochs):
            got = epochs(wrap(stoke.DataLoader)(L.Indices(6), batch_size=2, shuffle=True,
                                                num_workers=workers), 4)
            for e in got:
                T.check(len(e) == 3 and sorted(x for b in e for x in b) == list(range(6)),
                        "%s, workers=%d: %r" % (wrap.__name__, workers, got))
            T.check(len({str(e) for e in got}) > 1, "every epoch in one order: %r" % got)


@case
def unbatched_sampler():
    # batch_size=None: timm's wraps the sampler itself
    ref = epochs(multi_epochs(L.TorchLoader)(L.Indices(4), batch_size=None))
    got = epochs(multi_epochs(stoke.DataLoader)(L.Indices(4), batch_size=None))
    T.check(ref == [[0, 1, 2, 3]] * 3, "torch: %r" % ref)
    T.check(got == ref, "%r" % got)


@case
def other_sampler_refused():
    loader = stoke.DataLoader(L.Indices(6), batch_size=2)
    object.__setattr__(loader, "batch_sampler", [[5, 4], [3, 2]])
    try:
        iter(loader)
    except ValueError as e:
        T.check("batch_sampler" in str(e) and "[[5, 4], [3, 2]]" in str(e), str(e))
    else:
        T.check(False, "no ValueError")


L.run_cases()
