"""A Python map-style dataset (a NumPy row and a NumPy scalar label per sample) loaded by 2
worker processes (the default for num_workers > 0) or 2 worker threads delivers what
torch.utils.data.DataLoader delivers for it: len(loader), a list [rows, labels] per batch, the
same dtypes, shapes and values, in the same order -- sequentially, with a shared sampler, and
with stoke's own seeded shuffle (every row once per epoch, each with its label, the order a
function of the seed and the epoch).  Unshuffled, the rows and labels equal the same data read
from .npy by the C source."""
import stoke_testlib as T

T.no_forked_python_under_tsan()

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader, RandomSampler  # noqa: E402

import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=150, row_floats=100)
BS = 16
NB = 10  # ceil(150 / 16)


class Rows:
    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        return data[i], labels[i]  # a row and a NumPy scalar label


def copy(batch):
    """A batch as [rows, labels] copies (the tensors view the loader's pinned slots)."""
    T.check(type(batch) is list and len(batch) == 2, "batch %r" % (type(batch),))
    return [t.clone() for t in batch]


def same(a, b, what):
    T.check(len(a) == len(b) == NB, "%s: batches %d %d" % (what, len(a), len(b)))
    for k, (x, y) in enumerate(zip(a, b)):
        for f in range(2):
            T.check(type(x[f]) is torch.Tensor and x[f].dtype == y[f].dtype
                    and x[f].shape == y[f].shape,
                    "%s: batch %d field %d: %s %s %s vs %s %s"
                    % (what, k, f, type(x[f]).__name__, x[f].dtype, tuple(x[f].shape),
                       y[f].dtype, tuple(y[f].shape)))
            T.check(torch.equal(x[f], y[f]), "%s: batch %d field %d differs" % (what, k, f))


def stoke_epoch(**kw):
    loader = stoke.DataLoader(Rows(), batch_size=BS, pin_memory=False, **kw)
    T.check(len(loader) == NB, "len %d" % len(loader))
    return [copy(b) for b in loader]


ref = [copy(b) for b in TorchLoader(Rows(), batch_size=BS)]
T.check(len(ref) == NB, "torch gave %d batches" % len(ref))

# 1. in order: as torch, by processes (the default), threads and the caller's thread
for kw in ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "threads"},
           {"num_workers": 0}):
    same(stoke_epoch(**kw), ref, "sequential %s" % kw)

# 2. the same as the C source reading the .npy files
src = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=BS, num_workers=2,
                       pin_memory=False)
npy = [[torch.from_dlpack(b["data"]).clone(), torch.from_dlpack(b["label"]).clone()]
       for b in src]
same(npy, ref, "npy source")

# 3. a seeded RandomSampler given to both: torch's order
for kw in ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "threads"}):
    mine = stoke_epoch(sampler=RandomSampler(Rows(), generator=torch.Generator().manual_seed(11)),
                       **kw)
    theirs = [copy(b) for b in TorchLoader(
        Rows(), batch_size=BS,
        sampler=RandomSampler(Rows(), generator=torch.Generator().manual_seed(11)))]
    same(mine, theirs, "RandomSampler %s" % kw)
    T.check(not torch.equal(mine[0][0], ref[0][0]), "the sampler's order was not used")

# 4. stoke's shuffle (seed=11): each epoch a permutation of the rows, each row with its label;
#    the same seed gives the same epochs, the next epoch another order
row_of = {data[i].tobytes(): i for i in range(len(data))}
T.check(len(row_of) == len(data), "rows are not distinct")


def order(batches):
    idx = []
    for rows, labs in batches:
        got = [row_of[r.numpy().tobytes()] for r in rows]
        T.check(labs.tolist() == labels[got].tolist(), "labels differ at %s" % got)
        idx += got
    T.check(sorted(idx) == list(range(len(data))), "not a permutation: %s" % idx[:20])
    return idx


def shuffled(**kw):
    loader = stoke.DataLoader(Rows(), batch_size=BS, shuffle=True, seed=11, pin_memory=False,
                              **kw)
    return [order([copy(b) for b in loader]) for _ in range(2)]


procs = shuffled(num_workers=2)
T.check(procs[0] != list(range(len(data))), "epoch 0 is not shuffled")
T.check(procs[0] != procs[1], "epochs 0 and 1 in the same order")
T.check(shuffled(num_workers=2) == procs, "seed 11 gave other orders the second time")
T.check(shuffled(num_workers=2, worker_mode="threads") == procs, "threads' order differs")
T.check(shuffled(num_workers=0) == procs, "num_workers=0's order differs")

# Without NumPy (nor torch, which needs it here): a Python dataset is an ImportError that says
# so when the loader is made (it was an AttributeError on None at the first batch); a source
# string still loads.
NO_NUMPY = r"""
import sys
sys.modules["numpy"] = None  # import numpy raises ImportError from here on
sys.modules["torch"] = None
import stoke
try:
    stoke.DataLoader([1, 2, 3], batch_size=2)
    print("no error")
except ImportError as e:
    print("ImportError:", e)
n = sum(len(b) for b in stoke.DataLoader("synthetic:100", batch_size=10, pin_memory=False))
print("synthetic", n)
"""
import subprocess, sys  # noqa: E401,E402
r = subprocess.run([sys.executable, "-c", NO_NUMPY], capture_output=True, text=True, timeout=60)
T.check("ImportError: stoke.DataLoader over a Python dataset needs NumPy" in r.stdout and
        "synthetic 100" in r.stdout, "without NumPy: %s %s" % (r.stdout, r.stderr[-2000:]))
print("ok")
