"""The drop-in's batches as a skeleton and a table (MAGIC_FAST, stoke/_dropin.py): leaves of
every dtype, 0-d and empty tensors, NumPy arrays, namedtuples and nesting come out equal to the
collate_fn's own output (0 and 2 workers) through the compiled builders; a structure that
changes every batch (its dict keys) stops being sent as a skeleton after _FAST_MAX of them and
the consumer's compiled builders stay bounded; a structure nested too deep is pickled; a tensor
kept from a batch keeps its block: its values stay while the loader reuses its other blocks."""
import collections
import gc

import stoke_testlib as T

T.no_forked_python_under_tsan()

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402
from dropin_lib import Indices as Index  # noqa: E402
from stoke import _dropin  # noqa: E402

Pair = collections.namedtuple("Pair", "a b")

DTYPES = [torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]

built = [0]
orig_get = _dropin._Builders.get


def counting_get(self, view, a, n):
    built[0] += 1
    return orig_get(self, view, a, n)


_dropin._Builders.get = counting_get


def many(batch):
    """A structure of every kind of leaf the skeleton carries, from the batch's indices."""
    ix = torch.tensor(batch, dtype=torch.int64)
    n = len(batch)
    out = {"d%d" % k: (ix.view(n, 1) * 3 + torch.arange(k + 1)).to(dt)
           for k, dt in enumerate(DTYPES)}
    out["scalar"] = ix.sum()
    out["empty"] = torch.empty((0, 3), dtype=torch.float32)
    out["rows0"] = torch.empty((n, 0), dtype=torch.int16)
    out["cube"] = (ix.view(n, 1, 1).double() + torch.arange(6.0).view(2, 3)) / 7
    out["pair"] = Pair(ix + 1, [ix.float(), (ix.view(n, 1).repeat(1, 2),)])
    return out


def arrays(batch):
    ix = np.array(batch, dtype=np.int64)
    return {"f": (ix[:, None] * 0.5 + np.arange(3)).astype(np.float32),
            "i": ix.astype(np.int16), "s": np.array(ix.sum()), "e": np.zeros((0, 2))}


def same(ref, got, path):
    T.check(type(got) is type(ref), "%s: %s, want %s" % (path, type(got), type(ref)))
    if isinstance(ref, torch.Tensor):
        T.check(got.dtype == ref.dtype and got.shape == ref.shape and torch.equal(got, ref),
                "%s: %s %s %s, want %s %s %s" % (path, got.dtype, tuple(got.shape), got,
                                                 ref.dtype, tuple(ref.shape), ref))
    elif isinstance(ref, np.ndarray):
        T.check(got.dtype == ref.dtype and got.shape == ref.shape and np.array_equal(got, ref),
                "%s: %r, want %r" % (path, got, ref))
    elif isinstance(ref, dict):
        T.check(list(got) == list(ref), "%s: keys %s, want %s" % (path, list(got), list(ref)))
        for k in ref:
            same(ref[k], got[k], "%s[%r]" % (path, k))
    elif isinstance(ref, (list, tuple)):
        T.check(len(got) == len(ref), "%s: %d items, want %d" % (path, len(got), len(ref)))
        for k, (r, g) in enumerate(zip(ref, got)):
            same(r, g, "%s[%d]" % (path, k))
    else:
        T.check(got == ref, "%s: %r, want %r" % (path, got, ref))


def run(collate, what, n=40, batch_size=6, **kw):
    for workers in (0, 2):
        built[0] = 0
        loader = stoke.DataLoader(Index(n), batch_size=batch_size, num_workers=workers,
                                  collate_fn=collate, **kw)
        k = 0
        for b in loader:
            idx = list(range(k * batch_size, min(n, (k + 1) * batch_size)))
            same(collate(idx), b, "%s workers=%d batch %d" % (what, workers, k))
            k += 1
        T.check(k == -(-n // batch_size), "%s workers=%d: %d batches" % (what, workers, k))
        yield workers, loader, k


# every leaf kind through the builders, each batch (but batch 0 without workers: made at
# construction in a probe block, which keeps its structure, _probe_block)
for workers, loader, k in run(many, "many leaves"):
    k -= workers == 0
    T.check(built[0] == k, "many leaves workers=%d: %d of %d batches through a builder"
            % (workers, built[0], k))
    T.check(len(loader._writer.builders.cache) == 1, "many leaves workers=%d: %d builders"
            % (workers, len(loader._writer.builders.cache)))
for workers, loader, k in run(arrays, "NumPy arrays"):
    k -= workers == 0
    T.check(built[0] == k, "NumPy arrays workers=%d: %d of %d batches through a builder"
            % (workers, built[0], k))
print("ok (leaves)")


# a structure that changes every batch: skeletons up to _FAST_MAX, then pickles
def keyed(batch):
    return {"k%d" % batch[0]: torch.tensor(batch)}


nb = 3 * _dropin._FAST_MAX
for workers, loader, k in run(keyed, "changing keys", n=nb, batch_size=1):
    cap = _dropin._FAST_MAX * max(1, workers)  # each worker process sends its own
    T.check(min(nb, _dropin._FAST_MAX) <= built[0] <= cap,
            "changing keys workers=%d: %d batches through a builder, want %d..%d"
            % (workers, built[0], _dropin._FAST_MAX, cap))
    T.check(len(loader._writer.builders.cache) <= _dropin._Builders.MAX,
            "changing keys workers=%d: %d builders kept" % (workers,
                                                            len(loader._writer.builders.cache)))
print("ok (changing structures)")


# nested deeper than a builder's expression takes: pickled, the same values
def deep(batch):
    x = torch.tensor(batch)
    for _ in range(_dropin._SKELETON_DEPTH + 8):
        x = [x]
    return x


for workers, loader, k in run(deep, "deep nesting"):
    T.check(built[0] == 0, "deep nesting workers=%d: %d batches through a builder"
            % (workers, built[0]))
print("ok (deep)")


# a kept tensor keeps its block while the loader goes on through the others
class Rows:
    def __len__(self):
        return 512

    def __getitem__(self, i):
        return {"x": torch.full((64,), i, dtype=torch.int64)}


for workers in (0, 2):
    loader = stoke.DataLoader(Rows(), batch_size=8, num_workers=workers, prefetch_factor=2)
    it = iter(loader)
    kept = next(it)["x"]
    want = kept.clone()
    gc.collect()
    T.check(loader._outstanding == 1, "kept tensor workers=%d: %d batches outstanding"
            % (workers, loader._outstanding))
    rest = sum(1 for _ in it)
    T.check(rest == 63, "kept tensor workers=%d: %d more batches" % (workers, rest))
    T.check(torch.equal(kept, want), "kept tensor workers=%d: its values changed" % workers)
    del kept
    gc.collect()
    T.check(loader._outstanding == 0, "kept tensor workers=%d: %d batches outstanding after "
            "the tensor went" % (workers, loader._outstanding))
print("ok (lifetime)")
