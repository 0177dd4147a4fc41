"""What a training script changes on the dataset or the loader after DataLoader(...), and a
worker's exception that does not pickle, against torch's DataLoader in the same run:

1. num_workers=0: dataset.transform set after the loader was made reaches batch 0 too (batch 0,
   made at construction with the old one, was delivered: [[0, 1], [102, 103]]), also when it
   was set twice (a float at the address of the one it replaced).
2. Worker processes keep the dataset as it was when they were forked: an attribute set later
   (a curriculum's dataset.scale = epoch, set before the first pass or between passes) is told
   by one RuntimeWarning naming it, at the first iter() after it (every epoch replayed epoch 0's
   data silently); with persistent_workers=True a change after the first pass is not told
   (torch's persistent workers do not see it either).
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

# -- 2. worker processes: told, once, naming the attribute --
want, _ = epochs(TorchLoader, 3, set_scale, num_workers=2)
got, told = epochs(stoke.DataLoader, 3, set_scale, num_workers=2)
T.check(want == [[[100, 101], [102, 103]], [[200, 201], [202, 203]], [[300, 301], [302, 303]]],
        "torch: %s" % want)
T.check(len(told) == 1 and "dataset's 'scale' changed" in told[0]
        and "started at each iter()" in told[0] and "make a new DataLoader" in told[0],
        "workers: one warning naming 'scale': %s (batches %s)" % (told, got))
got, told = epochs(stoke.DataLoader, 3, lambda ds, ep: None, num_workers=2)
T.check(not told and got == [[[0, 1], [2, 3]]] * 3, "nothing changed: %s %s" % (got, told))
got, told = epochs(stoke.DataLoader, 3, lambda ds, ep: set_scale(ds, ep) if ep else None,
                   num_workers=2, persistent_workers=True)
T.check(not told and got == [[[0, 1], [2, 3]]] * 3,
        "persistent workers, changed after the first pass (torch's keep theirs): %s %s"
        % (got, told))
_, told = epochs(stoke.DataLoader, 2, lambda ds, ep: set_scale(ds, 0) if not ep else None,
                 num_workers=2, persistent_workers=True)
T.check(len(told) == 1 and "'scale'" in told[0] and "started at each" not in told[0],
        "persistent workers, changed before the first pass: %s" % told)
print("2. worker processes: a changed attribute told once")

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
