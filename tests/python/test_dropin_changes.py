"""What a training script changes on the dataset or the loader after DataLoader(...), and a
worker's exception that does not pickle, against torch's DataLoader in the same run:

1. num_workers=0: dataset.transform set after the loader was made reaches batch 0 too (batch 0,
   made at construction with the old one, was delivered: [[0, 1], [102, 103]]), also when it
   was set twice (a float at the address of the one it replaced).
2. Worker processes, forked at construction, get the dataset's attributes set since (a
   curriculum's dataset.scale = epoch, a dataset's own set_epoch, an attribute deleted) at each
   pass, as torch's workers, forked at each iter(), have them: the same batches as torch's
   (every epoch replayed epoch 0's data, with a warning); with persistent_workers=True only
   the changes before the first pass, as torch's.  What does not pickle, and what was set
   after set_epoch() started the pass, is told by one RuntimeWarning naming it.  A loader's
   descriptors are closed with it (one per loader stayed open).
3. Setting an attribute after construction: torch's ValueError for batch_size, sampler,
   batch_sampler, drop_last, dataset and persistent_workers (its message), stoke's for
   collate_fn, num_workers, timeout and the others its workers never see (they were ignored
   silently: dl.batch_size = 4 still gave batches of 2); other attributes set freely, and a
   subclass that clears torch's _DataLoader__initialized sets any.
4. len(iter(loader)) == len(loader) (TypeError: object of type '_Pass' has no len()); an
   IterableDataset's iterator has none, as torch's, and list(iter(loader)) sets off no
   "Length of IterableDataset" warning at the next pass.
5. A worker's exception that does not pickle (an attribute holding a lock) is raised as its
   own type with its message, as torch rebuilds it (it was a RuntimeError: `except ValueError`
   missed it)."""
import threading
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
T.no_forked_python_under_tsan()
import stoke  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402


class Scaled(torch.utils.data.Dataset):
    def __init__(self):
        self.scale = 0

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i + 100 * self.scale


def epochs(cls, n, change, **kw):
    ds = Scaled()
    dl = cls(ds, batch_size=2, **kw)
    got = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for ep in range(n):
            change(ds, ep)
            got.append([b.tolist() for b in dl])
    told = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)
            and "changed after this DataLoader" in str(x.message)]
    return got, told


def set_scale(ds, ep):
    ds.scale = ep + 1


# -- 1. num_workers=0: batch 0 follows the dataset as it is at the first iter() --
want, _ = epochs(TorchLoader, 2, set_scale)
got, told = epochs(stoke.DataLoader, 2, set_scale)
T.check(got == want == [[[100, 101], [102, 103]], [[200, 201], [202, 203]]] and not told,
        "num_workers=0: stoke %s, torch %s, %s" % (got, want, told))
# set twice: the second float may take the address the first one freed (compared by id()
# alone, the change was missed: batch 0 with the old scale)
for cls in (TorchLoader, stoke.DataLoader):
    ds = Scaled()
    dl = cls(ds, batch_size=2)
    ds.scale = float(2)
    ds.scale = float(3)
    got = [b.tolist() for b in dl]
    T.check(got == [[300.0, 301.0], [302.0, 303.0]], "%s, set twice: %s" % (cls, got))
print("1. num_workers=0: batch 0 made again after the dataset changed")

# -- 2. worker processes: the attributes set since the fork reach them, as torch's --
def same_as_torch(n, change, what, ds_cls=Scaled, **kw):
    want, _ = epochs(TorchLoader, n, change, **kw) if ds_cls is Scaled else (None, None)
    got, told = epochs(stoke.DataLoader, n, change, **kw)
    T.check(got == want and not told, "%s: stoke %s, torch %s, %s" % (what, got, want, told))
    return got


got = same_as_torch(3, set_scale, "scale set before each pass", num_workers=2)
T.check(got == [[[100, 101], [102, 103]], [[200, 201], [202, 203]], [[300, 301], [302, 303]]],
        "scale each pass: %s" % got)
same_as_torch(3, lambda ds, ep: None, "nothing changed", num_workers=2)
got = same_as_torch(3, lambda ds, ep: set_scale(ds, ep) if ep else None,
                    "persistent workers, changed after the first pass (torch's keep theirs)",
                    num_workers=2, persistent_workers=True)
T.check(got == [[[0, 1], [2, 3]]] * 3, "persistent: %s" % got)
got = same_as_torch(2, lambda ds, ep: set_scale(ds, 0) if not ep else None,
                    "persistent workers, changed before the first pass",
                    num_workers=2, persistent_workers=True)
T.check(got == [[[100, 101], [102, 103]]] * 2, "persistent, before: %s" % got)


def deleted(ds, ep):  # a class attribute under it: deleting the instance's shows it
    if ep == 1:
        del ds.scale
    elif ep == 2:
        ds.scale = 5


Scaled.scale = 7
got = same_as_torch(3, deleted, "an attribute deleted, then set again", num_workers=2)
T.check(got == [[[0, 1], [2, 3]], [[700, 701], [702, 703]], [[500, 501], [502, 503]]],
        "deleted: %s" % got)
del Scaled.scale


def narrow_in_worker(worker_id):  # what a worker sets is gone at the next pass, as torch's
    info = torch.utils.data.get_worker_info()
    info.dataset.scale += 10


got = same_as_torch(2, set_scale, "worker_init_fn changing the dataset", num_workers=2,
                    worker_init_fn=narrow_in_worker)
T.check(got == [[[1100, 1101], [1102, 1103]], [[1200, 1201], [1202, 1203]]], "init: %s" % got)


class Curriculum(torch.utils.data.IterableDataset):
    def __init__(self):
        self.level = 0

    def set_epoch(self, epoch):  # the dataset's own: the script calls it before each pass
        self.level = epoch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        return iter([i + 1000 * self.level for i in range(k, 4, n)])


for persistent in (False, True):
    out = []
    for cls in (TorchLoader, stoke.DataLoader):
        ds = Curriculum()
        dl = cls(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            passes = []
            for ep in range(3):
                ds.set_epoch(ep + 1)
                passes.append(sorted(int(x) for x in dl))
        out.append((passes, [str(x.message) for x in w]))
    T.check(out[0] == out[1] and not out[1][1], "IterableDataset's set_epoch, persistent=%s: "
            "torch %s, stoke %s" % (persistent, out[0], out[1]))
T.check(out[0][0] == [[1000, 1001, 1002, 1003]] * 3, "persistent curriculum: %s" % out[0][0])

# what does not pickle is told, by name and why, once; the rest is sent
ds = Scaled()
dl = stoke.DataLoader(ds, batch_size=2, num_workers=2)
ds.scale = 1
ds.lock = threading.Lock()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    got = [[b.tolist() for b in dl] for _ in range(2)]
told = [str(x.message) for x in w if "changed after this DataLoader" in str(x.message)]
T.check(got == [[[100, 101], [102, 103]]] * 2 and len(told) == 1 and "'lock'" in told[0]
        and "'scale'" not in told[0] and "pickle" in told[0] and "started at each iter()"
        in told[0] and "make a new DataLoader" in told[0], "unpicklable: %s %s" % (got, told))
# set after set_epoch() started the pass: the workers may have begun it: told
ds = Scaled()
dl = stoke.DataLoader(ds, batch_size=2, num_workers=2)
list(dl)
dl.set_epoch(1)
ds.scale = 2
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    list(dl)
told = [str(x.message) for x in w if "changed after this DataLoader" in str(x.message)]
T.check(len(told) == 1 and "'scale'" in told[0] and "set_epoch()" in told[0],
        "after set_epoch: %s" % told)
print("2. worker processes: the dataset's attributes set since the fork reach them")

# -- 2b. ... and those of the datasets inside it: a Subset's dataset (random_split's), a
# ConcatDataset's parts, one replaced by another (they were not seen: epoch 0's data) --
from torch.utils.data import ConcatDataset, Subset  # noqa: E402


def nested(make, change, n=3, **kw):
    out = []
    for cls in (TorchLoader, stoke.DataLoader):
        ds = make()
        dl = cls(ds, batch_size=2, **kw)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            passes = []
            for ep in range(n):
                change(ds, ep)
                passes.append(sorted(x for b in dl for x in b.tolist()))
        out.append((passes, [str(x.message) for x in w if "changed after" in str(x.message)]))
    return out


def set_inner(ds, ep):
    ds.dataset.scale = ep + 1


def set_part(ds, ep):
    ds.datasets[1].scale = 10 * (ep + 1)


def swap_part(ds, ep):
    if ep == 1:
        ds.datasets = [ds.datasets[0], Scaled()]
    if ep >= 1:
        ds.datasets[1].scale = ep


for kw in ({"num_workers": 2}, {"num_workers": 2, "persistent_workers": True},
           {"num_workers": 0}):
    for what, make, change in (
            ("a Subset's dataset", lambda: Subset(Scaled(), [3, 1, 0]), set_inner),
            ("a ConcatDataset's part", lambda: ConcatDataset([Scaled(), Scaled()]), set_part),
            ("a ConcatDataset's part replaced", lambda: ConcatDataset([Scaled(), Scaled()]),
             swap_part)):
        (want, _), (got, told) = nested(make, change, **kw)
        T.check(got == want and not told, "%s %s: stoke %s, torch %s, %s" % (
            what, kw, got, want, told))


class Plain:  # a dataset that is no torch Dataset (duck-typed), with an attribute of that name
    def __init__(self):
        self.scale = 5

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i + 100 * self.scale


def to_plain(ds, ep):  # (its old dataset's 'scale' was sent as deleted, from the new one)
    if ep == 1:
        ds.dataset = Plain()


def shorter(ds, ep):  # (its parts' 'datasets.1.scale' was looked for in the new, shorter list)
    if ep == 1:
        ds.datasets = [Subset(Scaled(), [0, 1, 2, 3, 0, 1, 2, 3])]
        ds.datasets[0].dataset.scale = 3
        ds.cumulative_sizes = ConcatDataset.cumsum(ds.datasets)


for kw in ({"num_workers": 2}, {"num_workers": 0}):
    for what, make, change in (
            ("a Subset's dataset replaced by another kind", lambda: Subset(Scaled(), [3, 1, 0]),
             to_plain),
            ("a ConcatDataset's parts replaced by fewer",
             lambda: ConcatDataset([Scaled(), Scaled()]), shorter)):
        (want, _), (got, told) = nested(make, change, **kw)
        T.check(got == want and not told, "%s %s: stoke %s, torch %s, %s" % (
            what, kw, got, want, told))
(want, _), (got, _) = nested(lambda: Subset(Scaled(), [0, 1]), set_inner, num_workers=2)
T.check(want == [[100, 101], [200, 201], [300, 301]], "a Subset's dataset, torch: %s" % want)
print("2b. the datasets inside the dataset: their attributes set since the fork reach them")

# -- 2c. a TensorDataset's tensors replaced (relabelling): served from the next pass, as torch's
# (the tensors taken at construction were served: the old labels, silently) --
from torch.utils.data import TensorDataset  # noqa: E402
for nw, extra in ((0, {}), (2, {}), (2, {"persistent_workers": True}),
                  (2, {"worker_mode": "processes"})):
    out = []
    for cls in (TorchLoader, stoke.DataLoader):
        if cls is TorchLoader and "worker_mode" in extra:
            cls, extra_t = TorchLoader, {}
        else:
            extra_t = extra
        x = torch.arange(6)
        ds = TensorDataset(x, torch.zeros(6, dtype=torch.long))
        dl = cls(ds, batch_size=3, num_workers=nw, **extra_t)
        first = [b[1].tolist() for b in dl]
        ds.tensors = (x, torch.arange(100, 106))
        out.append((first, [b[1].tolist() for b in dl]))
    T.check(out[0] == out[1], "TensorDataset relabelled, %d workers %s: torch %s, stoke %s"
            % (nw, extra, out[0], out[1]))
# grown (rows appended), then shrunk: each epoch has the batches of its length, as torch's (it
# was a ValueError); a negative index counts from the new length
for nw, extra in ((0, {}), (2, {}), (2, {"worker_mode": "processes"})):
    out = []
    for cls in (TorchLoader, stoke.DataLoader):
        extra_t = {} if cls is TorchLoader else extra
        ds = TensorDataset(torch.arange(6), torch.zeros(6))
        dl = cls(ds, batch_size=3, num_workers=nw, sampler=[0, 1, -1, 2], **extra_t) if (
            extra) else cls(ds, batch_size=3, num_workers=nw)
        got = [[b[0].tolist() for b in dl]]
        ds.tensors = (torch.arange(10, 18), torch.zeros(8))
        got.append([b[0].tolist() for b in dl])
        ds.tensors = (torch.arange(20, 24), torch.ones(4))
        got.append([b[0].tolist() for b in dl])
        out.append(got)
    T.check(out[0] == out[1], "TensorDataset grown and shrunk, %d workers %s: torch %s, stoke %s"
            % (nw, extra, out[0], out[1]))
ds = TensorDataset(torch.arange(6), torch.zeros(6))
dl = stoke.DataLoader(ds, batch_size=3)
list(dl)
ds.tensors = (torch.arange(8.0), torch.zeros(8))  # another dtype: the rows' size
try:
    list(dl)
    T.check(False, "a TensorDataset's dtype changed under its loader: no error")
except ValueError as e:
    T.check("make a new DataLoader" in str(e), "dtype: %s" % e)
print("2c. a TensorDataset's tensors replaced: served from the next pass")

# -- 2b. a loader's descriptors are closed with it (one was left open per loader) --
import gc  # noqa: E402
import os  # noqa: E402
for nw in (0, 2):
    list(stoke.DataLoader(Scaled(), batch_size=2, num_workers=nw))
gc.collect()
before = len(os.listdir("/proc/self/fd"))
for nw in (0, 2) * 10:
    list(stoke.DataLoader(Scaled(), batch_size=2, num_workers=nw))
gc.collect()
after = len(os.listdir("/proc/self/fd"))
T.check(after <= before, "descriptors: %d before 20 loaders, %d after" % (before, after))
print("2b. a loader's descriptors closed with it")

# -- 3. attributes after construction --
for cls in (TorchLoader, stoke.DataLoader):
    dl = cls(Scaled(), batch_size=2)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                 "persistent_workers"):
        try:
            setattr(dl, attr, getattr(dl, attr))
            T.check(False, "%s: %s set" % (cls.__name__, attr))
        except ValueError as e:
            T.check(str(e) == "%s attribute should not be set after DataLoader is initialized"
                    % attr, "%s.%s: %s" % (cls.__module__, attr, e))
    dl.note = "mine"  # the script's own attributes
    T.check(dl.note == "mine", "an attribute of the script's own")
dl = stoke.DataLoader(Scaled(), batch_size=2, num_workers=1)
for attr in ("collate_fn", "worker_init_fn", "num_workers", "timeout", "prefetch_factor",
             "pin_memory", "pin_memory_device", "generator", "multiprocessing_context"):
    try:
        setattr(dl, attr, getattr(dl, attr))
        T.check(False, "stoke: %s set" % attr)
    except ValueError as e:
        T.check("stoke: %s cannot be changed after the DataLoader is made" % attr in str(e)
                and "make a new DataLoader" in str(e), "%s: %s" % (attr, e))
T.check([b.tolist() for b in dl] == [[0, 1], [2, 3]], "still iterates")
dl._DataLoader__initialized = False  # timm's MultiEpochsDataLoader's way
dl.batch_sampler = dl.batch_sampler
dl._DataLoader__initialized = True
print("3. attributes: torch's ValueError, stoke's for what its workers never see")

# -- 4. len of an iterator --
for nw in (0, 2):
    for cls in (TorchLoader, stoke.DataLoader):
        dl = cls(Scaled(), batch_size=3, num_workers=nw)
        it = iter(dl)
        T.check(len(it) == len(dl) == 2, "%s, %d workers: len(iter) %d" % (cls, nw, len(it)))
        list(it)



class Stream(torch.utils.data.IterableDataset):
    def __len__(self):
        return 5

    def __iter__(self):
        return iter(range(5))


# an IterableDataset's iterator has no len (torch's neither); list() asks for it, and a len()
# that counted as the loader's set off torch's "Length of IterableDataset" warnings next pass
for cls in (TorchLoader, stoke.DataLoader):
    dl = cls(Stream(), batch_size=None)
    try:
        len(iter(dl))
        T.check(False, "%s: an IterableDataset's iterator has a len" % cls)
    except TypeError:
        pass
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        passes = [list(iter(dl)) for _ in range(2)]
    T.check([[int(x) for x in p] for p in passes] == [list(range(5))] * 2 and not w,
            "%s: %s %s" % (cls, passes, [str(x.message) for x in w]))
print("4. len(iter(loader)) == len(loader); none for an IterableDataset's")


# -- 5. an exception that does not pickle --
class Locked(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            e = ValueError("corrupt record 1")
            e.handle = threading.Lock()
            raise e
        return i


for cls in (TorchLoader, stoke.DataLoader):
    try:
        list(cls(Locked(), batch_size=2, num_workers=2))
        T.check(False, "%s: no error" % cls)
    except ValueError as e:
        T.check("corrupt record 1" in str(e), "%s: %s" % (cls, e))
print("5. an exception that does not pickle: its own type")
print("ok")
