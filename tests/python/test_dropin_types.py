"""What a batch and an exception are, as torch's DataLoader gives them (a review as a torch user
found each different): tensors of mixed dtypes in one column with num_workers=0 (an int then a
float) make the promoted dtype, not a RuntimeError; a dataset's exception whose __init__ takes
other arguments (it does not pickle) keeps its type with num_workers=0, not a RuntimeError; a
collate_fn's tensor subclasses (torchvision's tv_tensors: a subclass with attributes) and
nn.Parameters come back as themselves, requires_grad kept, not as plain tensors; a
worker_init_fn's exception is raised as itself at every pass, not only the first (then a
LoaderError without its type); a loop that keeps each batch's labels keeps only them, not a
copy of each whole batch; one tensor of a batch saved, pickled or deep-copied carries itself,
not the batch; with num_workers=0 a collate_fn's output that does not pickle is yielded as it
is."""
import copy
import gc
import io
import os
import collections
import pickle
import threading

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import stoke  # noqa: E402

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)
WORKERS = (0, 2) if PROCS else (0,)


def first(cls, ds, **kw):
    b = next(iter(cls(ds, **kw)))
    gc.collect()  # (torch's iterator gone before stoke forks: a child would run its __del__)
    return b


# --- mixed dtypes in a column, num_workers=0: torch.stack's promotion ----------------------------
for name, vals in (("int64 then float32", [torch.tensor(3), torch.tensor(2.5)]),
                   ("int32[2] then float32[2]", [torch.ones(2, dtype=torch.int32), torch.ones(2)]),
                   ("NumPy 0-d int then float", [np.array(3), np.array(2.5)]),
                   ("float32 then float64", [torch.tensor(1.0),
                                             torch.tensor(2.0, dtype=torch.float64)])):
    ref = first(TorchLoader, vals, batch_size=2)
    got = first(stoke.DataLoader, vals, batch_size=2)
    T.check(got.dtype == ref.dtype and got.tolist() == ref.tolist(),
            "%s: %s %s, torch's %s %s" % (name, got.dtype, got.tolist(), ref.dtype, ref.tolist()))
try:  # other shapes are still torch's error
    first(stoke.DataLoader, [torch.ones(2), torch.ones(3, dtype=torch.int32)], batch_size=2)
    T.check(False, "shapes 2 and 3 stacked")
except RuntimeError as e:
    T.check("size" in str(e), "shapes 2 and 3: %s" % e)


# --- an exception that does not pickle, num_workers=0 ------------------------------------------
class DecodeError(Exception):
    def __init__(self, path, code):
        super().__init__("cannot decode %s (%d)" % (path, code))
        self.path, self.code = path, code


class Bad:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            raise DecodeError("img%d.jpg" % i, 7)
        return i


for cls in (TorchLoader, stoke.DataLoader):
    try:
        list(cls(Bad(), batch_size=1))
        T.check(False, "%s: no error" % cls.__module__)
    except DecodeError as e:
        T.check(e.path == "img2.jpg" and e.code == 7, "%s: %r" % (cls.__module__, e))


# --- a collate_fn's tensor subclasses and Parameters -------------------------------------------
class Boxes(torch.Tensor):
    @staticmethod
    def __new__(cls, data, canvas_size):
        t = torch.as_tensor(data).as_subclass(cls)
        t.canvas_size = canvas_size
        return t


class Det:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(3, 4, 4), {"boxes": Boxes([[0.0, 0.0, i, i]], (4, 4)),
                                      "labels": torch.tensor([i])}


def detection_collate(b):
    return tuple(zip(*b))


def parameter_collate(b):
    return torch.nn.Parameter(torch.full((2,), float(len(b))))


for nw in WORKERS:
    for cls in (TorchLoader, stoke.DataLoader):
        what = "%s num_workers=%d" % (cls.__module__, nw)
        imgs, targets = first(cls, Det(), batch_size=2, num_workers=nw,
                              collate_fn=detection_collate)
        bx = targets[1]["boxes"]
        T.check(type(bx) is Boxes and bx.canvas_size == (4, 4) and bx.tolist() == [[0, 0, 1, 1]]
                and type(targets[1]["labels"]) is torch.Tensor,
                "%s: %s %s" % (what, type(bx).__name__, getattr(bx, "__dict__", None)))
        p = first(cls, [0, 1], batch_size=2, num_workers=nw, collate_fn=parameter_collate)
        T.check(type(p) is torch.nn.Parameter and p.requires_grad and p.tolist() == [2.0, 2.0],
                "%s: a Parameter: %s %s" % (what, type(p).__name__, p.requires_grad))


# --- arguments that are not what torch takes: torch's error ------------------------------------
for bad in (2.0, True, 0, "2"):
    errs = []
    for cls in (TorchLoader, stoke.DataLoader):
        try:
            cls(list(range(8)), batch_size=bad)
            errs.append(None)
        except Exception as e:  # noqa: BLE001 - its type and text are compared
            errs.append((type(e), str(e)))
    T.check(errs[0] is not None and errs[0] == errs[1],
            "batch_size=%r: stoke %s, torch %s" % (bad, errs[1], errs[0]))
# prefetch_factor=-1 with workers: torch 2's ValueError, torch 1.13's AssertionError
errs = []
for cls in (TorchLoader, stoke.DataLoader):
    try:
        cls(list(range(8)), num_workers=2, prefetch_factor=-1)
        errs.append(None)
    except (ValueError, AssertionError) as e:
        errs.append(type(e))
T.check(errs[0] is not None and errs[0] == errs[1],
        "prefetch_factor=-1: stoke %s, torch %s" % (errs[1], errs[0]))


# --- a loop that keeps a part of each batch keeps only that part ----------------------------------
class Images:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((3, 96, 96), float(i)), i  # (batches of 432 KiB: each a mapping)


for nw in WORKERS:
    loader = stoke.DataLoader(Images(), batch_size=4, num_workers=nw)
    labels, images = [], []
    for x, y in loader:
        labels.append(y)
        images.append(float(x[:, 1, 2, 3].sum()))  # (the copies' values: a mapping each)
    del x
    buffers = int(loader.stats()["buffers"])
    del loader
    gc.collect()
    # (the first labels view the loader's own buffers, until the caller holds all but one:
    # each batch after is copied tensor by tensor, its label into 64 bytes of its own; the
    # whole block was copied, 432 KiB a label)
    held = stoke._stoke.PinnedBuffer.held()[1]
    T.check(images == [float(sum(range(4 * k, 4 * k + 4))) for k in range(16)],
            "num_workers=%d: the images %s" % (nw, images))
    T.check(torch.cat(labels).tolist() == list(range(64)) and len(labels) == 16,
            "num_workers=%d: the labels %s" % (nw, labels))
    del labels
    gc.collect()
    kept = held - stoke._stoke.PinnedBuffer.held()[1]
    T.check(0 < kept <= 64 * 16,
            "num_workers=%d: the %d labels copied keep %d bytes" % (nw, 16 - buffers, kept))


# --- one tensor of a batch saved, pickled or copied carries itself, not the batch ----------------
# (every tensor of a batch viewed one storage, the block: torch.save of a 32-byte label wrote
# the 432 KiB batch; torch's batches have a storage a tensor)
class Batch:  # a custom batch type: its structure is pickled into the block
    def __init__(self, x, y):
        self.x, self.y = x, y


def as_dict(samples):  # a string field: the structure is kept (0 workers) or pickled
    return {"x": torch.stack([x for x, _ in samples]), "y": torch.tensor([y for _, y in samples]),
            "name": ["s%d" % y for _, y in samples]}


def saved(t):
    f = io.BytesIO()
    torch.save(t, f)
    return len(f.getvalue())


for nw in WORKERS:
    for how, kw, label in (
            ("default_collate", {}, lambda b: b[1]),
            ("a dict with strings", {"collate_fn": as_dict}, lambda b: b["y"]),
            ("a custom batch type", {"collate_fn": lambda s: Batch(*list(as_dict(s).values())[:2])},
             lambda b: b.y)):
        what = "%s, num_workers=%d" % (how, nw)
        for k, b in enumerate(stoke.DataLoader(Images(), batch_size=4, num_workers=nw, **kw)):
            y = label(b)
            want = list(range(4 * k, 4 * k + 4))
            sizes = (saved(y), len(pickle.dumps(y)), saved(copy.deepcopy(y)))
            T.check(y.tolist() == want and all(n < 2048 for n in sizes),
                    "%s, batch %d: the label %s saved, pickled, deep-copied in %s bytes" % (
                        what, k, y.tolist(), sizes))
            if k == 2:
                break
        del b, y
        gc.collect()


# --- num_workers=0: a collate_fn's output that does not pickle is yielded as it is --------------
# (it had to pickle: "TypeError: cannot pickle '_thread.lock' object"; torch's does not)
class Locked:
    def __init__(self, x):
        self.x, self.lock = x, __import__("threading").Lock()


def lock_collate(samples):
    return Locked(torch.stack([x for x, _ in samples]))


for cls in (TorchLoader, stoke.DataLoader):
    got = [(type(b).__name__, b.x[:, 0, 0, 0].tolist(), type(b.lock).__name__)
           for b in cls(Images(), batch_size=16, collate_fn=lock_collate)]
    T.check(got == [("Locked", [float(i) for i in range(k, k + 16)], "lock")
                    for k in range(0, 64, 16)], "%s: %s" % (cls.__module__, got))


# ... and with stoke's own collate, which writes into the batch's block, samples of a class
# pickle cannot name (a dict subclass defined in a function, a namedtuple made in one) are
# yielded as torch's yields them: the structure goes by reference to this process's classes
# (it was the pickling error; before that, kept as it was, its tensors, views of the block,
# became the next batches' when held: corrupted values, then a crash once the loader went)
def local_samples():
    class D(dict):
        pass

    P = collections.namedtuple("P", "a b")

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return D(x=torch.full((4,), float(i)), p=P(i, str(i)))

    return DS(), D, P


ds, D, P = local_samples()
for cls in (TorchLoader, stoke.DataLoader):
    kept = list(cls(ds, batch_size=8))  # (held: past the loader's buffers, copied)
    gc.collect()
    got = [(type(b), b["x"][:, 0].tolist(), type(b["p"]), b["p"].a.tolist(), list(b["p"].b))
           for b in kept]
    T.check(got == [(D, [float(i) for i in range(k, k + 8)], P, list(range(k, k + 8)),
                     [str(i) for i in range(k, k + 8)]) for k in range(0, 32, 8)],
            "a local class in samples, %s: %s" % (cls.__module__, got))
    del kept, got
gc.collect()


# ... and samples holding an object that does not pickle at all (a lock: an attribute of a
# dict subclass, which torch's collate copies; a leaf, which torch's default_collate rejects
# and stoke passes through as a list) are yielded with that object, as torch's num_workers=0
# yields them (each was the lock's pickling error); the block's tensors stay their own batch's
class LockedDict(dict):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.lock = LOCK


LOCK = threading.Lock()


class LockedSamples(torch.utils.data.Dataset):
    def __init__(self, leaf):
        self.leaf = leaf

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if self.leaf:
            return {"x": torch.full((4,), float(i)), "lock": LOCK}
        return LockedDict(x=torch.full((4,), float(i)))


ref = list(TorchLoader(LockedSamples(False), batch_size=8))
kept = list(stoke.DataLoader(LockedSamples(False), batch_size=8))
gc.collect()
T.check([(type(b), b["x"][:, 0].tolist(), b.lock is LOCK) for b in kept]
        == [(type(b), b["x"][:, 0].tolist(), b.lock is LOCK) for b in ref]
        == [(LockedDict, [float(i) for i in range(k, k + 8)], True) for k in range(0, 32, 8)],
        "a dict subclass holding a lock: %s" % [(type(b), b["x"][:, 0].tolist()) for b in kept])
kept = list(stoke.DataLoader(LockedSamples(True), batch_size=8))
gc.collect()
T.check([(b["x"][:, 0].tolist(), b["lock"]) for b in kept]
        == [([float(i) for i in range(k, k + 8)], [LOCK] * 8) for k in range(0, 32, 8)],
        "a lock as a leaf, passed through: %s" % kept)
del ref, kept
gc.collect()


# ... but not an object the collation made (a dict subclass's __init__ keeping its values()
# view, run by the collation over the block's tensors): kept by reference it saw the last
# batch's values in every held batch; it is the pickling error, as before
class ValuesDict(dict):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.vals = self.values()


class ValuesSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return ValuesDict(x=torch.full((2,), float(i)))


try:
    kept = list(stoke.DataLoader(ValuesSamples(), batch_size=8))
    got = [(b["x"][:, 0].tolist(), list(b.vals)[0][:, 0].tolist()) for b in kept]
except Exception as e:  # noqa: BLE001 - the pickling error, under the loader's
    got = "%s: %s" % (type(e).__name__, e)
T.check(isinstance(got, str) and "cannot pickle 'dict_values'" in got,
        "an object the collation made that does not pickle: %s" % (got,))


# ... and samples that are no dense CPU tensors, held past the buffers (list(loader)): a sparse
# tensor (torch's unpickling kept each in a list, and its batch's block with it, until the
# loader ran out of buffers), a quantized one, an object array beside a tensor
class Odd:
    def __init__(self, f):
        self.f = f

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return self.f(i)


for name, f, same in (
        # (coalesced or not, as the sample was: torch's pickle leaves the flag out, and a
        # sparse tensor loaded uncoalesced has no indices())
        ("sparse", lambda i: torch.eye(3).to_sparse() * i,
         lambda a, b: torch.equal(a.to_dense(), b.to_dense()) and a.is_coalesced()
         and torch.equal(a.indices(), b.indices())),
        ("sparse, uncoalesced", lambda i: torch.sparse_coo_tensor([[0, 0], [1, 1]],
                                                                  [1.0, float(i)], (2, 2)),
         lambda a, b: torch.equal(a.to_dense(), b.to_dense()) and not a.is_coalesced()),
        ("quantized", lambda i: torch.quantize_per_tensor(torch.ones(4) * i, 0.1, 0, torch.qint8),
         lambda a, b: torch.equal(a.dequantize(), b.dequantize())),
        ("tensor, object array", lambda i: (torch.full((3,), float(i)),
                                            np.array(["a", i], dtype=object)),
         lambda a, b: torch.equal(a[0], b[0]) and list(a[1]) == list(b[1]))):
    for nw in WORKERS:
        got = list(stoke.DataLoader(Odd(f), batch_size=None, num_workers=nw))
        T.check(len(got) == 40 and all(same(g, f(i)) for i, g in enumerate(got)),
                "list(loader) of %s samples, num_workers=%d: %d batches" % (name, nw, len(got)))
        T.check(not getattr(torch._utils, "_sparse_tensors_to_validate", []),
                "%s: sparse tensors left to validate" % name)
        del got


# ... and sparse samples batched by the default collation: torch.stack, as torch's num_workers=0
# (stoke's stack into the block has no sparse out=: NotImplementedError), held and streamed
ref = list(TorchLoader(Odd(lambda i: {"x": torch.eye(3).to_sparse() * i, "y": i}), batch_size=8))
for nw in WORKERS:
    for hold in (True, False):
        loader = stoke.DataLoader(Odd(lambda i: {"x": torch.eye(3).to_sparse() * i, "y": i}),
                                  batch_size=8, num_workers=nw)
        got = list(loader) if hold else [(b["x"].to_dense(), b["y"]) for b in loader]
        for r, g in zip(ref, got):
            gx, gy = (g["x"], g["y"]) if hold else g
            T.check((not hold or gx.layout == r["x"].layout) and torch.equal(
                gx.to_dense(), r["x"].to_dense()) and torch.equal(gy, r["y"]),
                "sparse samples, default collation, num_workers=%d" % nw)
        T.check(len(got) == len(ref) == 5, "sparse samples: %d batches" % len(got))
        del got, loader

# ... and quantized samples batched by the default collation: torch.stack, as torch's
# num_workers=0 (stoke stacked into a quint8 tensor of the block, which has no qscheme:
# NotImplementedError 'aten::qscheme'; torch 1.13's own workers fail to pickle the batch)
quant = Odd(lambda i: torch.quantize_per_tensor(torch.tensor([1.0, 2.0 + i]), 0.1, 0,
                                                torch.quint8))
ref = list(TorchLoader(quant, batch_size=8))
for nw in WORKERS:
    got = list(stoke.DataLoader(quant, batch_size=8, num_workers=nw))
    T.check(len(got) == len(ref) == 5 and all(
        g.dtype == torch.quint8 and g.qscheme() == r.qscheme() and g.q_scale() == r.q_scale()
        and torch.equal(g.int_repr(), r.int_repr()) for g, r in zip(got, ref)),
        "quantized samples, default collation, num_workers=%d: %s" % (nw, got[:1]))
    del got


# --- a worker_init_fn that raises: its exception at every pass -----------------------------------
def bad_init(w):
    if w == 1:
        raise FileNotFoundError("shard-%d.bin missing" % w)


if PROCS:  # (torch 1.13's own workers print "can only test a child process" here: its bug)
    for cls in (TorchLoader, stoke.DataLoader):
        loader = cls(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=bad_init)
        for p in range(3):
            try:
                list(loader)
                T.check(False, "%s pass %d: no error" % (cls.__module__, p))
            except FileNotFoundError as e:
                T.check("shard-1.bin missing" in str(e), "%s pass %d: %s" % (cls.__module__, p, e))
        del loader
        gc.collect()
print("ok")
