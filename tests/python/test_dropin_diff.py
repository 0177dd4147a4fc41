"""stoke.DataLoader as a drop-in for torch.utils.data.DataLoader (issue 27), differential: each
case runs torch's DataLoader and stoke's on the same dataset with the same arguments and checks
len(loader), the batches' structure (tuple/list/dict/namedtuple, keys), leaf types (tensors are
torch.Tensor, strings stay lists), dtypes, shapes and values -- batch by batch where both are
sequential (shuffle=False, in order), as the multiset of samples per epoch where stoke's
permutation differs from torch's (shuffle=True).  Map-style datasets here: TensorDataset, dict
samples of 9 fields (nested, numbers, bools, NumPy, str), namedtuples, strings; 0, 1 and 2
workers."""
import collections
import itertools
import time

import stoke_testlib as T

T.no_forked_python_under_tsan()

np = T.need("numpy")
import dropin_lib as L  # noqa: E402
from dropin_lib import case, check_len, check_multiset, check_sequential, epoch, pair  # noqa: E402
from dropin_lib import Indices as Sized  # noqa: E402

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
def passed_through_leaves():
    """Leaves torch's default_collate rejects with a TypeError -- None, a Python complex, NumPy
    string and object arrays, other objects -- are passed through by design (docs/python.md),
    each column as a list, at the top, in a dict, and in a column of tuple samples too (it was
    the tuple zip(*batch) made there: (None, None)); a str column of tuple samples stays
    torch's tuple."""
    class Odd(Dataset):
        def __init__(self, f):
            self.f = f

        def __len__(self):
            return 8

        def __getitem__(self, i):
            return self.f(i)

    from fractions import Fraction
    for name, f, col, leaf in (
            ("None in a tuple", lambda i: (torch.tensor(i), None), lambda b: b[1],
             lambda x: x[1]),
            ("complex in a list", lambda i: [i, complex(i, 1)], lambda b: b[1], lambda x: x[1]),
            ("None in a dict", lambda i: {"x": i, "n": None}, lambda b: b["n"],
             lambda x: x["n"]),
            ("an object", lambda i: (i, Fraction(i, 3)), lambda b: b[1], lambda x: x[1]),
            ("NumPy <U2", lambda i: np.array(["a", "bc"]), lambda b: b, lambda x: x),
            ("NumPy object", lambda i: (i, np.array([i, None], dtype=object)), lambda b: b[1],
             lambda x: x[1]),
            ("None", lambda i: None, lambda b: b, lambda x: x)):
        try:
            next(iter(L.TorchLoader(Odd(f), batch_size=4)))
            T.check(False, "%s: torch's default_collate took it" % name)
        except TypeError:
            pass
        want = [leaf(f(i)) for i in range(8)]
        for workers in (0, 2):
            what = "%s workers=%d" % (name, workers)
            got = [col(b) for b in L.Loader(Odd(f), batch_size=4, num_workers=workers)]
            T.check(len(got) == 2 and all(type(c) is list and len(c) == 4 for c in got),
                    "%s: %s" % (what, [L.describe(c) for c in got]))
            flat = [v for c in got for v in c]
            T.check(all(type(a) is type(b) and (list(a) == list(b) if type(a) is np.ndarray
                                                else a == b) for a, b in zip(flat, want))
                    and len(flat) == 8,
                    "%s: leaves %r, want %r" % (what, flat, want))
    for workers in (0, 2):
        b = next(iter(L.Loader(Odd(lambda i: (i, "s%d" % i)), batch_size=2, num_workers=workers)))
        T.check(b[1] == ("s0", "s1"), "a str column workers=%d: %r" % (workers, b[1]))


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
    dist = DistributedSampler(Sized(10), num_replicas=2, rank=0)
    for ds, kw in ((Sized(10), {"batch_size": 3}),
                   (Sized(10), {"batch_size": 3, "shuffle": True}),
                   (Sized(10), {"batch_size": 3, "drop_last": True}),
                   (Sized(10), {"batch_size": 2, "sampler": dist, "num_workers": 2,
                                "multiprocessing_context": "fork", "prefetch_factor": 3}),
                   (Sized(10), {"batch_sampler": [[0, 1], [2, 3, 4]]}),
                   (Sized(10), {"batch_size": None}),
                   (Sized(10), {"batch_size": 4, "collate_fn": default_collate}),
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


def raises(exc, fn, text):
    """fn() raises exc, its message holding text."""
    try:
        fn()
    except exc as e:
        T.check(text in str(e), "%s raised, without %r: %s" % (exc.__name__, text, e))
        return e
    raise AssertionError("%s (%r) was not raised" % (exc.__name__, text))


@case
def argument_errors_as_torch():
    """Arguments torch refuses raise torch's exception type on torch's condition, compared
    with the torch installed: prefetch_factor 0 or negative with workers (1.13: an
    AssertionError; stoke took 0 as automatic), a generator that is no torch.Generator (a
    TypeError; stoke's was an AttributeError), timeout > 0 without workers (an AssertionError
    when iteration starts; stoke's was a LoaderError once a batch took longer).  The stage
    (made / iterated) may be earlier than torch's, never later; valid neighbours still work."""
    def outcome(cls, kw):
        try:
            loader = cls(Sized(8), batch_size=2, **kw)
        except Exception as e:  # noqa: BLE001 - its type is compared
            return "made", type(e)
        try:
            n = sum(1 for _ in loader)
        except Exception as e:  # noqa: BLE001
            return "iterated", type(e)
        return "ok", n

    stage = {"made": 0, "iterated": 1, "ok": 2}
    for kw in ({"num_workers": 2, "prefetch_factor": 0}, {"num_workers": 2, "prefetch_factor": -1},
               {"num_workers": 0, "prefetch_factor": 0}, {"num_workers": 2, "prefetch_factor": 1},
               {"shuffle": True, "generator": 3}, {"generator": "seed"},
               {"shuffle": True, "generator": torch.Generator().manual_seed(1)},
               {"timeout": 0.5}, {"timeout": 0.5, "num_workers": 0, "batch_size": None},
               {"timeout": 5, "num_workers": 2}, {"timeout": 0}):
        ref, got = outcome(L.TorchLoader, kw), outcome(L.Loader, kw)
        T.check(got[1] == ref[1] and stage[got[0]] <= stage[ref[0]],
                "%s: stoke %s %s, torch %s %s" % (kw, got[0], got[1], ref[0], ref[1]))


@case
def two_iterators_at_once():
    """Two iterators of one loader alive at once: torch's are independent (persistent_workers
    False); stoke delivers one pass at a time, so the superseded iterator raises a clear
    RuntimeError instead of going on in the new pass (zip(loader, loader) silently got half the
    batches, interleaved).  next(iter(loader)) then a for loop still works.  With
    persistent_workers=True torch's iter() resets and returns its one iterator: both names go
    on in the new pass, and stoke's do the same."""
    for workers in (0, 2):
        loader = L.Loader(Sized(10), batch_size=2, num_workers=workers)
        try:
            list(zip(loader, loader))
        except RuntimeError as e:
            T.check("superseded" in str(e) and "two DataLoader" in str(e), str(e))
        else:
            raise AssertionError("workers=%d: zip(loader, loader) raised nothing" % workers)
        it1 = iter(loader)
        T.check(next(it1).tolist() == [0, 1], "workers=%d: it1's first batch" % workers)
        it2 = iter(loader)
        T.check(next(it2).tolist() == [0, 1], "workers=%d: it2's first batch" % workers)
        raises(RuntimeError, lambda: next(it1), "superseded")
        T.check([b.tolist() for b in it2] == [[2, 3], [4, 5], [6, 7], [8, 9]],
                "workers=%d: the new pass lost batches" % workers)
        first = next(iter(loader))  # the common pattern: a look at one batch, then the epochs
        T.check(first.tolist() == [0, 1], "first batch %s" % first.tolist())
        for e in range(2):
            T.check([b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]],
                    "workers=%d: epoch %d after next(iter(loader))" % (workers, e))
    # a source string's loader too (its iterators are the C loader's own; with workers its
    # persistent_workers defaults to True, where iterators go on as torch's do)
    for workers in (0, 2):
        loader = L.Loader("synthetic:10,shape=4", batch_size=2, num_workers=workers,
                          persistent_workers=False)
        it1 = iter(loader)
        next(it1)
        it2 = iter(loader)
        raises(RuntimeError, lambda: next(it1), "superseded")
        T.check(sum(1 for _ in it2) == 5, "workers=%d: the source's new pass" % workers)
        raises(RuntimeError, lambda: list(zip(loader, loader)), "superseded")
    ref, got = pair(Sized(10), batch_size=2, num_workers=2, persistent_workers=True)
    r = [(a.tolist(), b.tolist()) for a, b in zip(ref, ref)]
    g = [(a.tolist(), b.tolist()) for a, b in zip(got, got)]
    T.check(r == g, "persistent_workers=True: zip gave %s, torch %s" % (g, r))


class MixedDtypes(Dataset):
    """float32 for sample 0 (and every 4th), float64 for the others."""
    def __init__(self, shape):
        self.shape = shape

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full(self.shape, 1 + 1e-12 * i,
                          dtype=torch.float32 if i % 4 == 0 else torch.float64)


@case
def mixed_dtypes_promote():
    """Samples of float32 and float64: torch's default_collate with num_workers=0 stacks them
    with type promotion (a float64 batch); stoke wrote them into a float32 block (the
    precision lost).  With workers torch stacks into the first sample's dtype (out=), as
    stoke does.  Small samples and big ones (the row-streaming path)."""
    import warnings
    for shape in ((2,), (3, 64, 64)):
        for workers in (0, 2):
            what = "shape %s workers=%d" % (shape, workers)
            ref, got = pair(MixedDtypes(shape), batch_size=4, num_workers=workers)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (a float64 batch past the measured block)
                r, g = epoch(ref), epoch(got)
            check_sequential(r, g, what)
            want = torch.float64 if workers == 0 else torch.float32
            T.check(all(b.dtype == want for b in g), "%s: %s" % (what, [b.dtype for b in g]))


class Keyed(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, k):
        return -k


@case
def sampler_keys_must_be_integers():
    """A sampler's keys: torch passes any key to __getitem__ as it is; stoke plans int64
    indices, and int() made "10" index 10 and 1.7 index 1 (other samples, silently): ints,
    NumPy and torch integer scalars are taken, anything else is a TypeError saying so."""
    for keys in (["1", "2", "10"], [1.7, 2.2]):
        raises(TypeError, lambda: epoch(L.Loader(Keyed(), sampler=keys, batch_size=2)),
                 "integer dataset indices")

    class Strs(torch.utils.data.Sampler):
        def __init__(self):
            pass

        def __len__(self):
            return 2

        def __iter__(self):
            return iter(["3", "4"])

    raises(TypeError, lambda: epoch(L.Loader(Keyed(), sampler=Strs(), batch_size=2)),
             "'3' (str)")
    raises(TypeError, lambda: epoch(L.Loader(Keyed(), batch_sampler=[[1, 2.5]])), "2.5")

    class Later(torch.utils.data.Sampler):  # a bad key first in the second pass
        def __init__(self):
            self.passes = 0

        def __len__(self):
            return 2

        def __iter__(self):
            self.passes += 1
            return iter([3, 4] if self.passes == 1 else ["3", "4"])

    # the same TypeError in a later pass and from set_epoch (it was a LoaderError that only
    # said "set_epoch(1) of dataset python:Keyed failed")
    for nw in (0, 2):
        got = L.Loader(Keyed(), sampler=Later(), batch_size=2, num_workers=nw)
        T.check(len(epoch(got)) == 1, "the first pass")
        raises(TypeError, lambda: epoch(got), "'3' (str)")
        raises(TypeError, lambda: got.set_epoch(7), "'3' (str)")
        del got
    for keys in ([np.int64(3), np.int32(5)], [torch.tensor(3), torch.tensor(5)],
                 np.array([3, 5]), torch.tensor([3, 5])):
        ref, got = pair(Keyed(), sampler=keys, batch_size=2)
        check_sequential(epoch(ref), epoch(got), "keys %r" % (keys,))


class Counted(torch.utils.data.Sampler):
    """Pass k (from 1) yields the 4 keys rotated by k; raises `fail[k]` on the passes in it."""

    def __init__(self, fail):
        self.passes, self.fail = 0, fail

    def __len__(self):
        return 4

    def __iter__(self):
        self.passes += 1
        if self.passes in self.fail:
            raise self.fail[self.passes]
        k = self.passes
        return iter([(i + k) % 4 for i in range(4)])


@case
def sampler_raising_is_read_again():
    """A sampler that raises: Ctrl-C and sys.exit() in a later pass come out as themselves, as
    torch's (they were a LoaderError); a pass whose planning failed reads the sampler again at
    the next iter(), as torch's iter() does -- after a failed first iter() the next one planned
    nothing (IndexError), and after a failed set_epoch(e) the pass delivered the last epoch's
    order without asking the sampler."""
    for nw in (0, 2):
        for exc in (KeyboardInterrupt(), SystemExit(3)):
            ref = torch.utils.data.DataLoader(Keyed(), sampler=Counted({2: exc}), batch_size=2,
                                              num_workers=nw)
            got = L.Loader(Keyed(), sampler=Counted({2: exc}), batch_size=2, num_workers=nw)
            for loader, who in ((ref, "torch"), (got, "stoke")):
                T.check(len(epoch(loader)) == 2, "%s: the first pass" % who)
                try:
                    epoch(loader)
                    T.check(False, "%s %r: nothing raised" % (who, exc))
                except BaseException as e:  # noqa: BLE001
                    T.check(type(e) is type(exc), "%s %r raised %s: %s" % (
                        who, exc, type(e).__name__, e))
            del ref, got
        # the first iter()'s sampler raises: the next iter() reads it again
        got = L.Loader(Keyed(), sampler=Counted({1: ValueError("pass 1")}), batch_size=2,
                       num_workers=nw)
        raises(ValueError, lambda: next(iter(got)), "pass 1")
        first = next(iter(got))
        T.check(got.sampler.passes == 2 and first.tolist() == [-2, -3],
                "after a failed first iter(): %r, sampler passes %d" % (first, got.sampler.passes))
        del got
        # a failed set_epoch(e): the next pass asks the sampler again, never replays
        got = L.Loader(Keyed(), sampler=Counted({2: ValueError("pass 2")}), batch_size=2,
                       num_workers=nw)
        e0 = [b.tolist() for b in got]
        raises(ValueError, lambda: got.set_epoch(5), "pass 2")
        e5 = [b.tolist() for b in got]
        T.check(e0 == [[-1, -2], [-3, 0]] and e5 == [[-3, 0], [-1, -2]]
                and got.sampler.passes == 3,
                "after a failed set_epoch: %r then %r, sampler passes %d" % (
                    e0, e5, got.sampler.passes))
        del got


class Endless(torch.utils.data.Sampler):
    """mmengine's InfiniteSampler's shape: a __len__ (the dataset's), an __iter__ without end;
    batches=True: lists of 2 keys (a batch_sampler)."""

    def __init__(self, batches=False):
        self.batches = batches

    def __len__(self):
        return 4

    def __iter__(self):
        for i in itertools.count():
            yield [i % 20, (i + 1) % 20] if self.batches else i % 20


@case
def infinite_sampler_is_an_error():
    """A sampler (or batch_sampler) that yields more than its len(): torch iterates it without
    end; stoke plans an epoch from one pass, and list() of it grew until memory ran out (a hang,
    then the OOM killer).  Now at most what the epoch's batches hold, plus one, is drawn, and
    more is a ValueError saying so, for every way a sampler is read; a sampler a little longer
    than its len() whose items still make len(loader) batches is read as torch reads it."""
    for nw in (0, 2):
        for kw in ({"sampler": Endless(), "batch_size": 2},
                   {"sampler": Endless(), "batch_size": None},
                   {"batch_sampler": Endless(batches=True)},
                   {"sampler": Endless(batches=True), "batch_size": None}):
            t0 = time.monotonic()
            raises(ValueError, lambda: epoch(L.Loader(Keyed(), num_workers=nw, **kw)),
                   "items in one pass, 4 times its len()")
            T.check(time.monotonic() - t0 < 60, "%s: no answer for a minute" % kw)

    class OneMore(torch.utils.data.Sampler):  # len() 10, yields 11: 3 batches of 4 all the same
        def __init__(self):
            pass

        def __len__(self):
            return 10

        def __iter__(self):
            return iter(range(11))

    class Drawing(torch.utils.data.Sampler):  # an iterator: __iter__ draws, returns itself
        def __init__(self):
            self.g, self.draws = torch.Generator().manual_seed(5), 0

        def __len__(self):
            return 12

        def __iter__(self):
            self.draws += 1
            self.order = iter(torch.randperm(12, generator=self.g).tolist())
            return self

        def __next__(self):
            return next(self.order)

    # a sampler a little longer than its len() is torch's batches, as before the bound; and
    # __iter__ is called once a pass (islice(iter(s)) called an iterator's __iter__ twice)
    for nw in (0, 2):
        for kw in ({"batch_size": 4}, {"batch_size": 5, "drop_last": True}):
            ref, got = pair(Keyed(), sampler=OneMore(), num_workers=nw, **kw)
            check_sequential(epoch(ref), epoch(got), "a sampler one past its len() %s" % kw)
        ref = L.TorchLoader(Keyed(), sampler=Drawing(), batch_size=12, num_workers=nw)
        got = L.Loader(Keyed(), sampler=Drawing(), batch_size=12, num_workers=nw)
        want, have = epoch(ref) + epoch(ref), epoch(got) + epoch(got)
        check_sequential(want, have, "an iterator sampler, 2 passes")
        T.check(ref.sampler.draws == got.sampler.draws == 2,
                "__iter__ calls: torch %d, stoke %d" % (ref.sampler.draws, got.sampler.draws))


@case
def shuffle_follows_manual_seed():
    """shuffle=True without generator= or seed=: each pass's seed is drawn from torch's
    default generator, as RandomSampler's (it was 0: every run and every seed of a sweep got
    the same order).  torch.manual_seed(s) sets the order (the same s, the same order; before
    or after the loader is made), two seeds give two orders, and the global RNG moves as
    torch's does (the same torch.rand() after the passes); seed= stays deterministic."""
    def orders(torch_seed, workers=0, before=True, epochs=2, **kw):
        if before:
            torch.manual_seed(torch_seed)
        loader = L.Loader(Sized(40), batch_size=8, shuffle=True, num_workers=workers, **kw)
        if not before:
            torch.manual_seed(torch_seed)
        out = [torch.cat(list(loader)).tolist() for _ in range(epochs)]
        return out, torch.rand(1).item()

    for workers in (0, 2):
        a, ra = orders(1, workers)
        b, rb = orders(1, workers)
        c, _ = orders(2, workers)
        T.check(a == b and ra == rb, "workers=%d: seed 1 twice gave two orders" % workers)
        T.check(a[0] != c[0], "workers=%d: seeds 1 and 2 gave the same order" % workers)
        T.check(a[0] != a[1], "workers=%d: two epochs in the same order" % workers)
        T.check(orders(1, workers, before=False) == (a, ra),
                "workers=%d: torch.manual_seed after the loader was made" % workers)
        for pw in ((False, True) if workers else (False,)):
            torch.manual_seed(7)
            ref = L.TorchLoader(Sized(40), batch_size=8, shuffle=True, num_workers=workers,
                                persistent_workers=pw)
            for _ in range(3):
                list(ref)
            want = torch.rand(1).item()
            got = orders(7, workers, epochs=3, persistent_workers=pw)[1]
            T.check(got == want, "workers=%d persistent=%s: the global RNG after 3 passes: "
                    "%r, torch's %r" % (workers, pw, got, want))
    fixed = [orders(s, seed=5)[0] for s in (1, 2)]
    T.check(fixed[0] == fixed[1], "seed=5: the order changed with torch.manual_seed")


@case
def shuffle_drawn_seed_state():
    """state_dict() of a shuffle with a drawn seed holds that seed: a loader made under
    another torch seed restores the same epoch's remaining batches."""
    torch.manual_seed(3)
    a = L.Loader(Sized(40), batch_size=8, shuffle=True)
    list(a)
    it = iter(a)
    next(it)
    next(it)
    st = a.state_dict()
    rest = [b.tolist() for b in it]
    torch.manual_seed(99)
    b = L.Loader(Sized(40), batch_size=8, shuffle=True)
    b.load_state_dict(st)
    got = [x.tolist() for x in b]
    T.check(got == rest, "restored %s, want %s" % (got, rest))


@case
def state_at_epoch_end():
    """A state_dict() taken once the epoch's last batch was delivered (the usual end-of-epoch
    checkpoint, after the loop or inside it) resumes at the start of the next epoch, as the
    saving loader's next pass (torchdata's StatefulDataLoader's rule): it restored an empty
    first pass, and `for epoch in range(start, n): for b in loader:` lost an epoch.  The saving
    loader's own next pass is unchanged; 0 and 2 workers, a drawn shuffle seed, and an
    IterableDataset (0 workers, one worker thread)."""
    for workers in (0, 2):
        what = "workers=%d" % workers
        a = L.Loader(Sized(10), batch_size=4, shuffle=True, seed=3, num_workers=workers)
        inside = None
        for i, b in enumerate(a):
            if i == len(a) - 1:
                inside = a.state_dict()
        after = a.state_dict()
        want = [b.tolist() for b in a]
        # (with the epoch's batches: a Python dataset's epochs may change length, so a restore
        # could not tell the end from the lengths)
        T.check((after["epoch"], after["batches_yielded"], after["epoch_batches"]) == (0, 3, 3)
                and inside == after, "%s: states %s, %s" % (what, inside, after))
        for st in (inside, after):
            b = L.Loader(Sized(10), batch_size=4, shuffle=True, seed=3, num_workers=workers)
            b.load_state_dict(st)
            got = [x.tolist() for x in b]
            T.check(got == want, "%s: restored from %s: %s, the saving loader's next pass %s"
                    % (what, st, got, want))
            T.check(b.epoch == 1, "%s: restored epoch %d" % (what, b.epoch))
    torch.manual_seed(3)
    a = L.Loader(Sized(10), batch_size=4, shuffle=True)
    list(a)
    b = L.Loader(Sized(10), batch_size=4, shuffle=True)
    b.load_state_dict(a.state_dict())
    got = sorted(i for x in b for i in x.tolist())
    T.check(got == list(range(10)), "drawn seed: restored pass %s" % got)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    for kw in ({}, {"num_workers": 1, "worker_mode": "threads"}):
        a = L.Loader(Stream(), batch_size=2, **kw)
        list(a)
        st = a.state_dict()
        want = [x.tolist() for x in a]
        b = L.Loader(Stream(), batch_size=2, **kw)
        b.load_state_dict(st)
        got = [x.tolist() for x in b]
        T.check(got == want, "IterableDataset %s: restored from %s: %s, want %s"
                % (kw, st, got, want))


@case
def batch_sampler_as_sampler():
    """torch's batched read: sampler=BatchSampler(...), batch_size=None passes each list of
    indices to __getitem__ once (it was a TypeError); 0 and 2 workers."""
    from torch.utils.data import BatchSampler, SequentialSampler

    class Rows(Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, idx):
            return torch.tensor(idx) * 10

    for workers in (0, 2):
        sampler = BatchSampler(SequentialSampler(range(20)), 4, False)
        ref, got = pair(Rows(), sampler=sampler, batch_size=None, num_workers=workers)
        check_len(ref, got, "workers=%d" % workers)
        for e in range(2):
            check_sequential(epoch(ref), epoch(got), "workers=%d epoch %d" % (workers, e))


@case
def sampler_without_len():
    """torch makes a sampler's __len__ optional: only len(loader) needs it (its TypeError).
    stoke fixed its batches at construction and refused such a sampler; now each epoch is
    what the pass gives, as torch's, for a sampler, a batch_sampler and a sampler with
    batch_size=None, at 0 and 2 workers; the state after an epoch's loop resumes at the next
    epoch's start, and an endless one is a ValueError after 2^22 items."""
    class NoLen(torch.utils.data.Sampler):  # its passes: 6, 7, 9 items (epoch set by the test)
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            return iter(range(0, 11 + self.epoch, 2))

    class NoLenBatches(torch.utils.data.Sampler):  # its passes: 2, 5, 8 batches
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            for i in range(2 + self.epoch):
                yield [i, 2 * i + 1]

    for workers in (0, 2):
        for kw in ({"sampler": NoLen(), "batch_size": 2}, {"sampler": NoLen(), "batch_size": None},
                   {"batch_sampler": NoLenBatches()}):
            what = "workers=%d %s" % (workers, type(next(iter(kw.values()))).__name__)
            ref, got = pair(Sized(40), num_workers=workers, **kw)
            for e in range(3):
                for loader in (ref, got):
                    s = loader.batch_sampler if "batch_sampler" in kw else loader.sampler
                    getattr(s, "sampler", s).epoch = 3 * e
                check_sequential(epoch(ref), epoch(got), "%s epoch %d" % (what, e))
            check_len(ref, got, what)
            raises(TypeError, lambda: len(got), "has no len()")
        loader = L.Loader(Sized(40), num_workers=workers, sampler=NoLen(), batch_size=4)
        list(loader)
        st = loader.state_dict()
        T.check((st["epoch"], st["batches_yielded"], st["epoch_batches"]) == (0, 2, 2),
                "after the loop: %s" % st)
        again = L.Loader(Sized(40), num_workers=workers, sampler=NoLen(), batch_size=4)
        again.load_state_dict(st)
        T.check([b.tolist() for b in again] == [[0, 2, 4, 6], [8, 10]] and again.epoch == 1,
                "restored: epoch %d" % again.epoch)

    class NotImplementedLen(NoLen):  # (a __len__ that raises: torch iterates it too)
        def __len__(self):
            raise NotImplementedError

    # a BatchSampler over a sampler without a length (its len() raises TypeError), as
    # batch_sampler; a __len__ raising NotImplementedError
    for workers in (0, 2):
        for kw in ({"batch_sampler": torch.utils.data.BatchSampler(NoLen(), 4, False)},
                   {"sampler": NotImplementedLen(), "batch_size": 4}):
            ref, got = pair(Sized(40), num_workers=workers, **kw)
            check_sequential(epoch(ref), epoch(got), "workers=%d %s" % (workers, kw))
            for loader in (ref, got):  # (the same exception as torch's len(loader))
                try:
                    len(loader)
                except Exception as e:  # noqa: BLE001
                    loader.len_error = type(e)
            T.check(ref.len_error is got.len_error, "len(loader): %s, torch's %s"
                    % (got.len_error, ref.len_error))

    class Endless(torch.utils.data.Sampler):
        def __init__(self):
            pass

        def __iter__(self):
            return itertools.count()

    raises(ValueError, lambda: list(L.Loader(Sized(10), sampler=Endless(), batch_size=2)),
           "2^22 for one without a length")


@case
def getitems_without_batching():
    """batch_size=None: torch calls ds[i], never __getitems__ (stoke called __getitems__([i])
    and took [0])."""
    class G(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": i}

        def __getitems__(self, idx):
            return {"x": list(idx)}

    for workers in (0, 2):
        ref, got = pair(G(), batch_size=None, num_workers=workers)
        check_sequential(epoch(ref), epoch(got), "workers=%d" % workers)


@case
def tensordataset_negative_and_grad():
    """A TensorDataset's rows: a negative index counts from the end, as torch's ds[-1] (it was
    an IndexError); tensors that require grad raise a clear error (the batch is written into
    stoke's memory, outside autograd) instead of index_select's out= error."""
    X = torch.arange(20.).reshape(10, 2)
    for workers in (0, 2):
        ref, got = pair(TensorDataset(X), sampler=[-1, 3, -10], batch_size=2,
                        num_workers=workers)
        check_sequential(epoch(ref), epoch(got), "negative indices workers=%d" % workers)
    grad = TensorDataset(X.clone().requires_grad_())
    raises(RuntimeError, lambda: epoch(L.Loader(grad, batch_size=2)), "require grad")



@case
def rank_and_world_size():
    """rank= and world_size= (each, or one beside the launcher's environment) split a Python
    dataset as torch's DistributedSampler does, and loader.rank / loader.world_size say so
    (rank= alone was dropped: every rank loaded the whole dataset; and they read 0 / 1).  One
    without the other anywhere is an error, as for a source string."""
    import os
    from torch.utils.data import DistributedSampler
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                                            "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                                            "SLURM_NTASKS") if k in os.environ}
    try:
        want = [[int(i) for i in DistributedSampler(Sized(40), num_replicas=4, rank=1,
                                                    shuffle=False)]]
        for workers in (0, 2):
            loader = L.Loader(Sized(40), batch_size=None, rank=1, world_size=4,
                              num_workers=workers)
            T.check((loader.rank, loader.world_size) == (1, 4),
                    "rank, world_size: %s" % ((loader.rank, loader.world_size),))
            T.check([[int(b) for b in loader]] == want, "rank 1 of 4: %s" % list(loader))
        raises(ValueError, lambda: L.Loader(Sized(40), batch_size=2, rank=1), "world size")
        raises(ValueError, lambda: L.Loader(Sized(40), batch_size=2, world_size=4), "rank")
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "3", "4"
        loader = L.Loader(Sized(40), batch_size=None, rank=1)  # the argument beats RANK
        T.check((loader.rank, loader.world_size) == (1, 4) and [[int(b) for b in loader]]
                == want, "rank=1 with RANK=3 WORLD_SIZE=4: %s" % loader.rank)
        loader = L.Loader(Sized(40), batch_size=None, distributed=True)
        T.check((loader.rank, loader.world_size) == (3, 4), "RANK=3: %s" % loader.rank)
    finally:
        for k in ("RANK", "WORLD_SIZE"):
            os.environ.pop(k, None)
        os.environ.update(saved)


L.run_cases()
