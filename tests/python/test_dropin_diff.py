"""stoke.DataLoader as a drop-in for torch.utils.data.DataLoader (issue 27), differential: each
case runs torch's DataLoader and stoke's on the same dataset with the same arguments and checks
len(loader), the batches' structure (tuple/list/dict/namedtuple, keys), leaf types (tensors are
torch.Tensor, strings stay lists), dtypes, shapes and values -- batch by batch where both are
sequential (shuffle=False, in order), as the multiset of samples per epoch where stoke's
permutation differs from torch's (shuffle=True).  Map-style datasets here: TensorDataset, dict
samples of 9 fields (nested, numbers, bools, NumPy, str), namedtuples, strings; 0, 1 and 2
workers."""
import collections

import stoke_testlib as T

T.no_forked_python_under_tsan()

np = T.need("numpy")
import dropin_lib as L  # noqa: E402
from dropin_lib import case, check_len, check_multiset, check_sequential, epoch, pair  # noqa: E402

torch = L.torch
stoke = L.stoke
from torch.utils.data import Dataset, TensorDataset  # noqa: E402

g = torch.Generator().manual_seed(27)
X = torch.randn(203, 3, 8, 8, generator=g)
Y = torch.randint(0, 10, (203,), generator=g)
TDS = TensorDataset(X, Y)


@case
def tensordataset_sequential():
    for workers in (0, 1, 2):
        for drop_last in (False, True):
            what = "TensorDataset workers=%d drop_last=%s" % (workers, drop_last)
            ref, got = pair(TDS, batch_size=16, shuffle=False, num_workers=workers,
                            drop_last=drop_last)
            check_len(ref, got, what)
            r, s = epoch(ref), epoch(got)
            check_sequential(r, s, what)
            T.check(len(s) == (12 if drop_last else 13), "%s: %d batches" % (what, len(s)))


@case
def tensordataset_shuffled_epochs():
    """shuffle=True: every epoch holds each sample once, torch's batch sizes, and the order
    changes from one epoch to the next (as torch reshuffles); persistent workers too."""
    for workers, persistent in ((0, False), (2, False), (2, True)):
        what = "TensorDataset shuffle workers=%d persistent=%s" % (workers, persistent)
        ref, got = pair(TDS, batch_size=16, shuffle=True, num_workers=workers,
                        persistent_workers=persistent)
        check_len(ref, got, what)
        r = epoch(ref)
        orders = []
        for e in range(2):
            s = epoch(got)
            check_multiset(r, s, "%s epoch %d" % (what, e))
            orders.append(torch.cat([b[1] for b in s]).tolist())
            T.check(orders[-1] != Y.tolist(), "%s: shuffle=True delivered the dataset order" % what)
        T.check(orders[0] != orders[1], "%s: two epochs in the same order" % what)


@case
def generator_seeds_the_shuffle():
    """generator= seeds stoke's shuffle: the same seed gives the same order, another seed
    another order; the samples are torch's."""
    def order(seed, loader_cls=L.Loader):
        loader = loader_cls(TDS, batch_size=32, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(seed))
        return epoch(loader)

    a, b, c = order(5), order(5), order(6)
    ref = order(5, L.TorchLoader)
    check_sequential(a, b, "generator seed 5 twice")
    check_multiset(ref, a, "generator seed 5")
    T.check(any(not torch.equal(x[1], y[1]) or not torch.equal(x[0], y[0])
                for x, y in zip(a, c)), "seeds 5 and 6 gave the same order")


@case
def batch_size_none():
    """batch_size=None: samples one by one, converted (not collated) as torch does."""
    for workers in (0, 2):
        what = "batch_size=None workers=%d" % workers
        ref, got = pair(TDS, batch_size=None, num_workers=workers)
        check_len(ref, got, what)
        check_sequential(epoch(ref), epoch(got), what)


class Records(Dataset):
    """Dict samples of 9 fields: float32/float16/int32 tensors, a NumPy array and scalar, a
    Python int, float and bool, a nested dict holding a tensor and a str, a tuple of ints."""

    def __len__(self):
        return 90

    def __getitem__(self, i):
        return {
            "image": torch.arange(60, dtype=torch.float32).reshape(3, 4, 5) * 0.5 + i,
            "label": i % 7,
            "weight": i / 3.0,
            "flag": i % 3 == 0,
            "mask": (np.arange(6, dtype=np.uint8) * 3 + i).astype(np.uint8),
            "score": np.float32(i * 0.25),
            "meta": {"bbox": torch.tensor([i, i + 1, 2 * i, 3 * i], dtype=torch.int32),
                     "id": "s%04d" % i},
            "half": torch.full((2,), i / 8.0, dtype=torch.float16),
            "pair": (i, -i),
        }


@case
def dict_samples():
    ds = Records()
    for workers in (0, 1, 2):
        what = "dict samples workers=%d" % workers
        ref, got = pair(ds, batch_size=8, num_workers=workers)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        check_sequential(r, s, what)
    what = "dict samples shuffled workers=2"
    ref, got = pair(ds, batch_size=8, shuffle=True, num_workers=2)
    check_multiset(epoch(ref), epoch(got), what)


Point = collections.namedtuple("Point", "xy label name")


class Points(Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return Point(torch.tensor([i, -i], dtype=torch.float64), i, "p%d" % i)


@case
def namedtuple_samples():
    for workers in (0, 2):
        what = "namedtuple samples workers=%d" % workers
        ref, got = pair(Points(), batch_size=6, num_workers=workers)
        check_len(ref, got, what)
        check_sequential(epoch(ref), epoch(got), what)


class Captions(Dataset):
    """Strings in samples: a str, a list of str (collated as torch does: one sequence of str per
    position), beside a tensor.  (Dict samples' str fields, above, come as lists.)"""

    def __len__(self):
        return 41

    def __getitem__(self, i):
        return torch.full((4,), i, dtype=torch.int64), "caption %d" % i, ["tok%d" % i, "end"]


@case
def string_samples():
    for workers in (0, 2):
        what = "strings workers=%d" % workers
        ref, got = pair(Captions(), batch_size=5, num_workers=workers)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        check_sequential(r, s, what)
        # torch: a str at a tuple's position comes as the tuple zip(*batch) made
        T.check(s[0][1][:2] == ("caption 0", "caption 1"), "%s: str field %s" % (
            what, L.describe(s[0][1])))
    ref, got = pair(Captions(), batch_size=5, shuffle=True, num_workers=2)
    check_multiset(epoch(ref), epoch(got), "strings shuffled workers=2")


@case
def hold_every_batch():
    """batches = list(loader) holds more batches than any prefetch pool: every one keeps its
    values (no slot reused under a held batch)."""
    ds = TensorDataset(torch.arange(700 * 64, dtype=torch.float32).reshape(700, 64),
                       torch.arange(700))
    for workers in (0, 2):
        what = "list(loader) workers=%d" % workers
        ref, got = pair(ds, batch_size=4, num_workers=workers)
        held = list(got)
        T.check(len(held) == 175, "%s: %d batches" % (what, len(held)))
        check_sequential(list(ref), held, what)
        del held


class Numbers(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


@case
def torch_attributes():
    """loader.sampler, batch_sampler, collate_fn, prefetch_factor, multiprocessing_context as
    torch's: the user's objects (loader.sampler.set_epoch reaches the sampler iterated), else
    torch's defaults -- SequentialSampler, RandomSampler (shuffle), BatchSampler, default_collate
    or default_convert -- with their lengths; default_collate passed explicitly is the
    built-in collation."""
    from torch.utils.data import DistributedSampler, default_collate
    names = ("sampler", "batch_sampler", "collate_fn", "prefetch_factor",
             "multiprocessing_context", "pin_memory_device", "generator", "timeout")
    dist = DistributedSampler(Numbers(), num_replicas=2, rank=0)
    for ds, kw in ((Numbers(), {"batch_size": 3}),
                   (Numbers(), {"batch_size": 3, "shuffle": True}),
                   (Numbers(), {"batch_size": 3, "drop_last": True}),
                   (Numbers(), {"batch_size": 2, "sampler": dist, "num_workers": 2,
                                "multiprocessing_context": "fork", "prefetch_factor": 3}),
                   (Numbers(), {"batch_sampler": [[0, 1], [2, 3, 4]]}),
                   (Numbers(), {"batch_size": None}),
                   (Numbers(), {"batch_size": 4, "collate_fn": default_collate}),
                   (Stream(), {"batch_size": 4})):
        what = "%s %s" % (type(ds).__name__, kw)
        ref, got = pair(ds, **kw)
        for name in names:
            a, b = getattr(ref, name, "<missing>"), getattr(got, name, "<missing>")
            T.check(type(a) is type(b), "%s: loader.%s is %r, torch's %r" % (what, name, b, a))
            if name in ("collate_fn", "prefetch_factor", "pin_memory_device", "timeout"):
                T.check(a == b, "%s: loader.%s is %r, torch's %r" % (what, name, b, a))
        for name in ("sampler", "batch_sampler"):
            a, b = getattr(ref, name), getattr(got, name)
            if name[0] in kw:
                T.check(b is kw[name], "%s: loader.%s is not the one given" % (what, name))
            try:
                n = len(a)
            except TypeError:  # (torch's sampler of an IterableDataset has no length)
                n = None
            if n is not None:
                T.check(len(b) == n, "%s: len(loader.%s) %d, torch's %d" % (
                    what, name, len(b), n))
            for attr in ("batch_size", "drop_last"):
                T.check(getattr(a, attr, None) == getattr(b, attr, None), "%s: loader.%s.%s" % (
                    what, name, attr))
        if "sampler" in kw:
            T.check(got.batch_sampler.sampler is dist, "%s: batch_sampler.sampler" % what)
        if "collate_fn" in kw:
            T.check(got._writer.collate_fn is None, "%s: default_collate not built in" % what)
        if kw.get("shuffle"):  # stoke's own permutation, not loader.sampler's order
            check_multiset(epoch(ref), epoch(got), what)
        else:
            check_sequential(epoch(ref), epoch(got), what)


class Sized(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@case
def zero_batches():
    """An epoch without a batch (an empty dataset, fewer samples than batch_size with
    drop_last, an empty sampler or batch_sampler): len(loader) == 0 and empty passes, as
    torch's, not an error at construction."""
    for ds, kw in ((Sized(0), {"batch_size": 4}),
                   (Sized(3), {"batch_size": 4, "drop_last": True}),
                   (Sized(3), {"batch_size": 4, "drop_last": True, "shuffle": True}),
                   (Sized(5), {"sampler": [], "batch_size": 2}),
                   (Sized(5), {"batch_sampler": []}), (Sized(0), {"batch_size": None})):
        for workers in (0, 2):
            what = "%s(%d) %s workers=%d" % (type(ds).__name__, ds.n, kw, workers)
            ref, got = pair(ds, num_workers=workers, **kw)
            check_len(ref, got, what)
            for e in range(2):
                check_sequential(epoch(ref), epoch(got), "%s epoch %d" % (what, e))


@case
def repr_without_batch_size():
    """repr(loader) with batch_size None (batch_size=None, a batch_sampler)."""
    for kw in ({"batch_size": None}, {"batch_sampler": [[0, 1], [2]]}, {"batch_size": 2}):
        text = repr(L.Loader(Sized(3), **kw))
        T.check("batch_size=%s" % kw.get("batch_size") in text, "%s: %s" % (kw, text))


L.run_cases()
