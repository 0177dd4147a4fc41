"""stoke.DataLoader against torch.utils.data.DataLoader (issue 27), differential, part 2: variable
shapes and samplers -- token sequences padded by a user collate_fn (pad_sequence) and by stoke's
built-in padding (pad=, compared to the collate_fn's result, with the lengths), an
IterableDataset sharding itself by get_worker_info() (worker_init_fn, torch's seed rule), a
WeightedRandomSampler and a RandomSampler with seeded generators, a bucketing batch_sampler (a
list of index lists, and a user class), a custom batch type with a pin_memory() method; 0, 1
and 2 workers."""
import random
import warnings

import stoke_testlib as T

T.no_forked_python_under_tsan()

import dropin_lib as L  # noqa: E402
from dropin_lib import case, check_len, check_multiset, check_sequential, epoch, pair  # noqa: E402

torch = L.torch
from torch.nn.utils.rnn import pad_sequence  # noqa: E402
from torch.utils.data import (Dataset, DistributedSampler, IterableDataset,  # noqa: E402
                              RandomSampler, Sampler, WeightedRandomSampler, get_worker_info)


def seq_len(i):
    return 1 + (i * 7) % 23


class Tokens(Dataset):
    """Token sequences of 1..23 int64 ids and a label."""

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.arange(seq_len(i), dtype=torch.int64) + 1000 * i, i % 3


def pad_collate(batch):
    seqs, labels = zip(*batch)
    return (pad_sequence(seqs, batch_first=True, padding_value=0),
            torch.tensor([len(s) for s in seqs]), torch.tensor(labels))


def padded_samples(b):
    """A padded batch's samples without the padding (its width depends on the batch)."""
    ids, lengths, labels = b
    return [(tuple(ids[i, :n].tolist()), int(labels[i])) for i, n in enumerate(lengths.tolist())]


@case
def tokens_pad_collate_fn():
    for workers in (0, 1, 2):
        what = "pad collate_fn workers=%d" % workers
        ref, got = pair(Tokens(), batch_size=8, collate_fn=pad_collate, num_workers=workers)
        check_len(ref, got, what)
        check_sequential(epoch(ref), epoch(got), what)
    what = "pad collate_fn shuffled workers=2"
    ref, got = pair(Tokens(), batch_size=8, shuffle=True, collate_fn=pad_collate, num_workers=2)
    check_multiset(epoch(ref), epoch(got), what, key=padded_samples, ragged=True)


class TokenDicts(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        ids = torch.arange(seq_len(i), dtype=torch.int64) + 1000 * i
        return {"input_ids": ids, "labels": ids + 1, "label": i % 3}


def dict_pad_collate(max_length=None, multiple=None):
    def collate(batch):
        ids = [b["input_ids"][:max_length] for b in batch]
        labels = [b["labels"][:max_length] for b in batch]
        out = {"input_ids": pad_sequence(ids, batch_first=True, padding_value=0),
               "labels": pad_sequence(labels, batch_first=True, padding_value=-100),
               "label": torch.tensor([b["label"] for b in batch])}
        width = out["input_ids"].shape[1]
        if multiple and width % multiple:
            extra = multiple - width % multiple
            out["input_ids"] = torch.nn.functional.pad(out["input_ids"], (0, extra), value=0)
            out["labels"] = torch.nn.functional.pad(out["labels"], (0, extra), value=-100)
        return out, torch.tensor([len(x) for x in ids])
    return collate


@case
def tokens_builtin_padding():
    """pad={"input_ids": 0, "labels": -100} (no Python collate) gives what the padding
    collate_fn gives: input_ids, labels and label as torch collates them, padded to the
    batch's longest (or max_length, truncating; or a multiple), and the lengths as one more
    field ("<name>_lengths" beside each padded entry); return_lengths=False: only the
    sample's fields."""
    pad = {"input_ids": 0, "labels": -100}
    for workers, extra in ((0, {}), (2, {}), (2, {"max_length": 10}),
                           (1, {"pad_to_multiple_of": 8})):
        what = "built-in padding workers=%d %s" % (workers, extra)
        ref = L.TorchLoader(TokenDicts(), batch_size=8, num_workers=workers,
                            collate_fn=dict_pad_collate(extra.get("max_length"),
                                                        extra.get("pad_to_multiple_of")))
        got = L.Loader(TokenDicts(), batch_size=8, num_workers=workers, pad=pad, **extra)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        T.check(len(r) == len(s), "%s: %d batches, torch %d" % (what, len(s), len(r)))
        for k, ((rb, rlen), sb) in enumerate(zip(r, s)):
            T.check(isinstance(sb, dict), "%s: batch %s" % (what, L.describe(sb)))
            for key in ("input_ids", "labels", "label"):
                T.check(key in sb, "%s: batch %d has no %r: %s" % (what, k, key, L.describe(sb)))
                L.same(rb[key], sb[key], "%s: batch %d[%r]" % (what, k, key))
            more = [n for n in sb if n not in rb]
            T.check(sorted(more) == sorted(f + "_lengths" for f in pad),
                    "%s: batch %d: fields %s beside the sample's (want %s)" % (
                        what, k, more, [f + "_lengths" for f in pad]))
            T.check(all(isinstance(sb[n], torch.Tensor) and sb[n].shape == rlen.shape
                                 and torch.equal(sb[n].to(torch.int64), rlen) for n in more),
                    "%s: batch %d: fields beyond the sample's %s should be the lengths %s"
                    % (what, k, L.describe({n: sb[n] for n in more}), rlen.tolist()))
    got = L.Loader(TokenDicts(), batch_size=8, pad=pad, return_lengths=False)
    for b in got:
        T.check(list(b) == ["input_ids", "labels", "label"], "return_lengths=False: %s" % list(b))


class Frames(Dataset):
    """Ragged float rows of 3 values: 1..9 frames a sample; every third sample is a
    non-contiguous view (a transposed tensor), which takes the general copy path."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        n = 1 + (i * 5) % 9
        x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 0.25 * i
        if i % 3 == 0:
            x = x.t().contiguous().t()
        return {"frames": x, "id": i}


@case
def builtin_padding_rows():
    """pad= on samples of shape (n, 3) float32 with a pad value whose bytes differ (-1.5),
    contiguous and not: equal to pad_sequence's output for 0 and 2 workers, with and without
    max_length (truncation)."""
    for workers, cap in ((0, None), (2, None), (2, 4)):
        what = "built-in padding of float rows workers=%d max_length=%s" % (workers, cap)
        got = L.Loader(Frames(), batch_size=6, num_workers=workers, pad={"frames": -1.5},
                       max_length=cap)
        n = 0
        for b in got:
            ids = b["id"].tolist()
            rows = [Frames()[i]["frames"][:cap] for i in ids]
            want = pad_sequence(rows, batch_first=True, padding_value=-1.5)
            T.check(b["frames"].shape == want.shape and torch.equal(b["frames"], want),
                    "%s: ids %s: %s, want %s" % (what, ids, b["frames"], want))
            T.check(b["frames_lengths"].tolist() == [len(r) for r in rows],
                    "%s: lengths %s" % (what, b["frames_lengths"].tolist()))
            n += len(ids)
        T.check(n == 40, "%s: %d samples" % (what, n))


class Ragged(Dataset):
    """Samples given as a list: {"x": a leaf, "id": i} (NumPy arrays, lists, tensors, empty)."""

    def __init__(self, leaves):
        self.leaves = leaves

    def __len__(self):
        return len(self.leaves)

    def __getitem__(self, i):
        return {"x": self.leaves[i], "id": i}


def padded_want(leaves, ids, value, cap=None, multiple=None):
    rows = [torch.as_tensor(leaves[i])[:cap] for i in ids]
    lens = [len(r) for r in rows]
    width = max(lens)
    if multiple:
        width = -(-width // multiple) * multiple
        if cap is not None:
            width = min(width, max(cap, max(lens)))
    rest = rows[0].shape[1:]
    want = torch.full((len(rows), width) + tuple(rest), value, dtype=rows[0].dtype)
    for k, r in enumerate(rows):
        want[k, :len(r)] = r
    return want, lens


def check_padded(leaves, what, value=0, batch_size=4, cap=None, multiple=None, **kw):
    got = L.Loader(Ragged(leaves), batch_size=batch_size, pad={"x": value}, max_length=cap,
                   pad_to_multiple_of=multiple, **kw)
    n = 0
    for b in got:
        ids = b["id"].tolist()
        want, lens = padded_want(leaves, ids, value, cap, multiple)
        T.check(b["x"].dtype == want.dtype and b["x"].shape == want.shape
                and torch.equal(b["x"], want), "%s: ids %s: %s, want %s" % (what, ids,
                                                                            b["x"], want))
        T.check(b["x_lengths"].tolist() == lens, "%s: ids %s: lengths %s, want %s"
                % (what, ids, b["x_lengths"].tolist(), lens))
        n += len(ids)
    T.check(n == len(leaves), "%s: %d samples" % (what, n))


def pad_error(leaves, want, workers=0):
    got = L.Loader(Ragged(leaves), batch_size=len(leaves), pad={"x": 0}, num_workers=workers)
    try:
        for _ in got:
            pass
    except RuntimeError as e:
        T.check(want in str(e), "pad error, workers=%d: %r, want %r in it" % (workers, e, want))
    else:
        T.check(False, "pad error, workers=%d: no error, want %r" % (workers, want))


@case
def builtin_padding_edges():
    """pad= on leaves that are not all tensors (NumPy arrays, lists: converted as torch does),
    empty sequences, max_length 0 and with pad_to_multiple_of, a batch that outgrows its block
    (made again in the consumer's process), and samples that cannot be padded together: the
    error names the leaf and both shapes."""
    np = T.need("numpy")
    arrays = [np.arange(n, dtype=np.int32) * 3 + n for n in (3, 0, 5, 1, 7, 2, 0, 4, 6)]
    mixed = [torch.arange(n, dtype=torch.int64) for n in (2, 3)] + [[7, 8, 9, 10], [1]] + \
        [torch.arange(n, dtype=torch.int64) - 5 for n in (0, 4, 1)]
    for workers in (0, 2):
        check_padded(arrays, "NumPy int32 leaves workers=%d" % workers, value=-7,
                     num_workers=workers)
        check_padded(mixed, "tensors and lists workers=%d" % workers, value=3,
                     num_workers=workers)
        check_padded(arrays, "max_length=0 workers=%d" % workers, cap=0, num_workers=workers)
        check_padded(arrays, "max_length=5, multiple 4 workers=%d" % workers, cap=5,
                     multiple=4, num_workers=workers)
    # batch 0 small, a later batch far larger than the block measured on it
    big = [torch.arange(n, dtype=torch.int64) for n in (2, 3, 1, 2, 300000, 5, 1, 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_padded(big, "a batch larger than its block", value=-1)
    T.check(any("more than a block" in str(w.message) for w in caught),
            "a batch larger than its block: warnings %s" % [str(w.message) for w in caught])
    rows = [torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(1, 4)]
    for workers in (0, 2):
        pad_error(rows, "pad['x']: samples must have the same dtype and the same shape after "
                  "the first dimension (torch.float32 (2, 3), then torch.float32 (1, 4))",
                  workers)
    pad_error([torch.zeros(2), torch.zeros(3, dtype=torch.float64)],
              "(torch.float32 (2,), then torch.float64 (3,))")
    pad_error([torch.zeros(2), torch.tensor(5.0)], "(torch.float32 (2,), then torch.float32 ())")
    pad_error([torch.tensor(5), torch.zeros(3)], "(torch.int64 (), then torch.int64 ())")


@case
def builtin_padding_empty_lists():
    """pad= on a list-of-ints leaf where a sample's list is empty (an empty token list):
    torch.as_tensor([]) is float32, and the batch failed ("samples must have the same
    dtype"); the empty one takes the other samples' dtype (and trailing shape), as pad_sequence
    over tensors of that dtype pads it.  A batch of empty lists only takes the dtype of the
    leaf's last batch that had one (in the process that makes it), else float32."""
    toks = [[5, 6, 7], [], [8]]
    want = pad_sequence([torch.tensor(t, dtype=torch.int64) for t in toks], batch_first=True)
    for workers in (0, 2):
        what = "workers=%d" % workers
        b = next(iter(L.Loader(Ragged(toks), batch_size=3, pad={"x": 0}, num_workers=workers)))
        T.check(b["x"].dtype == torch.int64 and torch.equal(b["x"], want),
                "%s: %s, want %s" % (what, b["x"], want))
        T.check(b["x_lengths"].tolist() == [3, 0, 1], "%s: lengths %s" % (what, b["x_lengths"]))
        b = next(iter(L.Loader(Ragged([[], [[1, 2], [3, 4]]]), batch_size=2, pad={"x": -1},
                               num_workers=workers)))
        T.check(b["x"].dtype == torch.int64 and b["x"].tolist() == [[[-1, -1], [-1, -1]],
                                                                     [[1, 2], [3, 4]]],
                "%s: an empty list beside a list of lists: %s" % (what, b["x"]))
    got = list(L.Loader(Ragged([[1, 2], [3], [], []]), batch_size=2, pad={"x": 0}))
    T.check(got[1]["x"].dtype == torch.int64 and tuple(got[1]["x"].shape) == (2, 0),
            "empty lists after int lists: %s %s" % (got[1]["x"].dtype, got[1]["x"].shape))
    b = next(iter(L.Loader(Ragged([[], []]), batch_size=2, pad={"x": 0})))
    T.check(b["x"].dtype == torch.float32 and tuple(b["x"].shape) == (2, 0),
            "empty lists only: %s %s" % (b["x"].dtype, b["x"].shape))


@case
def builtin_padding_value_range():
    """A pad value the leaf's dtype cannot hold is torch's pad_sequence's RuntimeError, naming
    the leaf, the value and the dtype (it was wrapped silently: -1 padded uint8 with 255, 1e6
    float16 with inf); a float truncated for an integer dtype, infinities for a float one and
    any number for bool stay values, as there; a pad value that is no number is a TypeError,
    as there.  2**63 for int64 is an error here (pad_sequence's double wraps it)."""
    cases = [(torch.uint8, 300), (torch.uint8, -1), (torch.uint8, -0.5), (torch.uint8, 255.0),
             (torch.int64, 0.7), (torch.float16, 1e6), (torch.float16, 65504.0),
             (torch.float16, float("-inf")), (torch.bool, 2), (torch.int32, float("nan")),
             (torch.int8, float("inf")), (torch.int64, None), (torch.int64, "a")]
    for workers in (0, 2):
        for dtype, v in cases + [(torch.int64, 2 ** 63)]:
            what = "%s pad %r workers=%d" % (dtype, v, workers)
            samples = [torch.ones(n, dtype=dtype) for n in (1, 2)]
            try:
                want = pad_sequence(samples, batch_first=True, padding_value=v).tolist()
            except (RuntimeError, TypeError) as e:
                want = type(e)
            if v == 2 ** 63:
                want = RuntimeError
            try:
                b = next(iter(L.Loader(Ragged(samples), batch_size=2, pad={"x": v},
                                       num_workers=workers)))
                got = b["x"].tolist()
            except (RuntimeError, TypeError) as e:
                got = type(e)
                T.check("pad['x']" in str(e) and repr(v) in str(e)
                        and (got is TypeError or str(dtype)[6:] in str(e)),
                        "%s: the error does not name the leaf, value and dtype: %s" % (what, e))
            T.check(got == want, "%s: %s, pad_sequence's %s" % (what, got, want))


class Wrapped(torch.Tensor):
    """A tensor subclass holding its data in another tensor (__torch_dispatch__ unwraps it), as
    wrapper subclasses do: it has no data pointer of its own (data_ptr() is 0)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                   device=inner.device, strides=inner.stride())

    def __init__(self, inner):
        self.data_ = inner

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map
        def unwrap(x):
            return x.data_ if isinstance(x, Wrapped) else x
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


@case
def builtin_padding_views():
    """pad= on tensors whose bytes are not their values: conjugate views of complex samples
    (z.conj(): contiguous, the conjugation a bit), negative views, and a wrapper subclass whose
    data is another tensor's; the values are torch's (the samples' values, resolved), as with
    plain tensors beside them."""
    z = [(torch.arange(n, dtype=torch.float32) + 1j * (torch.arange(n) + 10)).to(
        torch.complex64) for n in (3, 1, 4, 2, 5, 0)]
    conj = [t.conj() for t in z]
    T.check(all(t.is_conj() and t.is_contiguous() for t in conj), "conj views")
    neg = [torch._neg_view(torch.arange(n, dtype=torch.float64) + 1) for n in (2, 4, 1, 3)]
    T.check(all(t.is_neg() and t.is_contiguous() for t in neg), "neg views")
    wrapped = [Wrapped(torch.arange(n, dtype=torch.int64) + 7) for n in (4, 2, 3, 1)]
    mixed = [conj[0], z[1], conj[2], z[3]]
    for workers in (0, 2):
        check_padded(conj, "conjugate views workers=%d" % workers, value=-1,
                     num_workers=workers)
        check_padded(mixed, "conjugate views and plain workers=%d" % workers, value=2,
                     num_workers=workers)
        check_padded(neg, "negative views workers=%d" % workers, value=0.5, num_workers=workers)
        check_padded(wrapped, "a wrapper subclass workers=%d" % workers, value=9,
                     num_workers=workers)


# --- an IterableDataset that shards itself --------------------------------------------------

MARK = 0


def mark_worker(wid):
    global MARK
    MARK = 100 + wid


class Stream(IterableDataset):
    """Yields 0..n-1, each worker its share (i % num_workers == id), with what the worker
    saw: its id, num_workers, its seed (as a str: 64 bits), whether torch's RNG was seeded with
    it, and the worker_init_fn's mark."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        seeded = info is None or torch.initial_seed() == info.seed
        seed = str(info.seed) if info else "-"
        for i in range(wid, self.n, nw):
            yield {"x": torch.tensor([i, i * i]), "worker": wid, "num_workers": nw,
                   "seed": seed, "seeded": seeded, "mark": MARK}


class SizedStream(Stream):
    def __len__(self):
        return self.n


def batch_sets(b):
    return [tuple(sorted(b["x"][:, 0].tolist()))]


@case
def iterable_sharded():
    """Each worker iterates its own copy: the samples are torch's (each once), torch's batches
    (a worker's samples, batched in the worker), get_worker_info() and worker_init_fn work,
    seeds follow torch's rule (torch seeded with info.seed; base_seed + worker id)."""
    for workers in (0, 1, 2):
        what = "IterableDataset workers=%d" % workers
        ref, got = pair(Stream(37), batch_size=5, num_workers=workers,
                        worker_init_fn=mark_worker)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        check_multiset(r, s, what, key=lambda b: [
            (x, w, n, ok, m) for x, w, n, ok, m in zip(
                b["x"][:, 0].tolist(), b["worker"].tolist(), b["num_workers"].tolist(),
                b["seeded"].tolist(), b["mark"].tolist())])
        check_multiset(r, s, what + " (batches)", key=batch_sets)
        xs = sorted(x for b in s for x in b["x"][:, 0].tolist())
        T.check(xs == list(range(37)), "%s: samples %s" % (what, xs))
        T.check(all(b["seeded"].all() for b in s), "%s: torch not seeded with info.seed" % what)
        if workers == 2:
            seeds = {}
            for b in s:
                for w, sd in zip(b["worker"].tolist(), b["seed"]):
                    seeds.setdefault(w, set()).add(int(sd))
            T.check(len(seeds[0]) == 1 and len(seeds[1]) == 1, "%s: seeds %s" % (what, seeds))
            T.check(seeds[1].pop() - seeds[0].pop() == 1, "%s: seeds not base + id" % what)
    what = "sized IterableDataset workers=2"
    ref, got = pair(SizedStream(37), batch_size=5, num_workers=2)
    check_len(ref, got, what)


class UnderSized(Stream):
    """A length that is an estimate: 10, where the stream (sharded per worker) yields n."""

    def __len__(self):
        return 10


def length_warnings(ws):
    return sum("Length of IterableDataset" in str(w.message) for w in ws)


@case
def iterable_len_does_not_bound_the_epoch():
    """An IterableDataset whose __len__ says less than it yields: every sample is delivered
    (the iterators bound the epoch, not the length), with torch's warning per batch past the
    length only when len(loader) was read before the iteration began."""
    for workers in (0, 1, 2):
        what = "IterableDataset len 10 of 100, workers=%d" % workers
        ref, got = pair(UnderSized(100), batch_size=4, num_workers=workers)
        r, s = epoch(ref), epoch(got)
        xs = sorted(x for b in s for x in b["x"][:, 0].tolist())
        T.check(xs == list(range(100)), "%s: %d samples of 100: %s" % (what, len(xs), xs[:40]))
        check_multiset(r, s, what, key=batch_sets)
        counts = []
        for loader in (ref, got):
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                check_len(ref, got, what)  # len(loader) before the pass: torch then warns
                n = len(list(loader))
            counts.append((n, length_warnings(ws)))
        T.check(counts[1] == counts[0] and counts[0][1] > 0,
                "%s: (batches, length warnings) %s, torch %s" % (what, counts[1], counts[0]))


# --- samplers -------------------------------------------------------------------------------

class Index(Dataset):
    def __len__(self):
        return 60

    def __getitem__(self, i):
        return i, torch.full((3,), float(i))


@case
def sampler_read_when_iteration_starts():
    """A sampler's order is taken when the iteration starts, as torch's iter() takes it:
    DistributedSampler.set_epoch(k) called after the loader is made (resuming at epoch k)
    gives epoch k's order in the first pass, then each set_epoch its epoch's."""
    for workers in (0, 2):
        what = "DistributedSampler.set_epoch after the loader, workers=%d" % workers
        samplers = [DistributedSampler(Index(), num_replicas=2, rank=1, shuffle=True, seed=3)
                    for _ in range(2)]
        ref = L.TorchLoader(Index(), batch_size=8, sampler=samplers[0], num_workers=workers)
        got = L.Loader(Index(), batch_size=8, sampler=samplers[1], num_workers=workers)
        check_len(ref, got, what)
        for e in (5, 6, 6, 2):
            for s in samplers:
                s.set_epoch(e)
            check_sequential(epoch(ref), epoch(got), "%s: epoch %d" % (what, e))


@case
def weighted_random_sampler():
    """The same WeightedRandomSampler (same weights, same generator seed) on both sides: the
    same indices drawn, epoch after epoch, in the sampler's order."""
    weights = [1.0 + (i % 5) for i in range(60)]
    for workers in (0, 2):
        what = "WeightedRandomSampler workers=%d" % workers
        samplers = [WeightedRandomSampler(weights, 150, replacement=True,
                                          generator=torch.Generator().manual_seed(9))
                    for _ in range(2)]
        ref = L.TorchLoader(Index(), batch_size=16, sampler=samplers[0], num_workers=workers)
        got = L.Loader(Index(), batch_size=16, sampler=samplers[1], num_workers=workers)
        check_len(ref, got, what)
        for e in range(2):
            r, s = epoch(ref), epoch(got)
            check_multiset(r, s, "%s epoch %d" % (what, e))
            check_sequential(r, s, "%s epoch %d (the sampler's order)" % (what, e))


@case
def random_sampler_generator():
    """A RandomSampler with a seeded generator passed as sampler=: torch's order."""
    for workers in (0, 2):
        what = "RandomSampler(generator) workers=%d" % workers
        ref = L.TorchLoader(Index(), batch_size=7, num_workers=workers, sampler=RandomSampler(
            Index(), generator=torch.Generator().manual_seed(4)))
        got = L.Loader(Index(), batch_size=7, num_workers=workers, sampler=RandomSampler(
            Index(), generator=torch.Generator().manual_seed(4)))
        check_len(ref, got, what)
        check_sequential(epoch(ref), epoch(got), what)


def buckets():
    """Bucketing: indices sorted by length, cut into batches of 3..9, the batches shuffled."""
    order = sorted(range(100), key=lambda i: (seq_len(i), i))
    rng = random.Random(3)
    out, k = [], 0
    while k < len(order):
        n = rng.randint(3, 9)
        out.append(order[k:k + n])
        k += n
    rng.shuffle(out)
    return out


class BucketSampler(Sampler):
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


@case
def bucketing_batch_sampler():
    plan = buckets()
    for workers in (0, 2):
        for name, bs in (("list", plan), ("Sampler", BucketSampler(plan))):
            what = "batch_sampler %s workers=%d" % (name, workers)
            ref, got = pair(Tokens(), batch_sampler=bs, collate_fn=pad_collate,
                            num_workers=workers)
            check_len(ref, got, what)
            T.check(len(got) == len(plan), "%s: len %d" % (what, len(got)))
            r, s = epoch(ref), epoch(got)
            check_sequential(r, s, what)
            for k, b in enumerate(s):
                T.check(b[2].tolist() == [i % 3 for i in plan[k]], "%s: batch %d" % (what, k))


# --- a custom batch type -------------------------------------------------------------------

class Pair:
    """A batch type as in torch's docs: built by collate_fn, with a pin_memory() method."""

    def __init__(self, samples):
        inp, tgt = zip(*samples)
        self.inp = torch.stack(inp)
        self.tgt = torch.tensor(tgt)
        self.pinned = 0

    def pin_memory(self):
        self.pinned += 1
        return self


class Rows(Dataset):
    def __len__(self):
        return 45

    def __getitem__(self, i):
        return torch.arange(12, dtype=torch.float32).reshape(3, 4) + i, i % 4


@case
def custom_batch_type():
    """collate_fn returning a custom batch type: the caller gets that type with its tensors'
    values (pin_memory() is not called: pin_memory=False, as torch)."""
    for workers in (0, 2):
        what = "custom batch workers=%d" % workers
        ref, got = pair(Rows(), batch_size=4, collate_fn=Pair, num_workers=workers,
                        pin_memory=False)
        check_len(ref, got, what)
        r = list(ref)
        n = 0
        for k, (a, b) in enumerate(zip(r, got)):  # compared as they come
            T.check(type(b) is Pair, "%s: batch %d is a %s" % (what, k, type(b).__name__))
            L.same(a.inp, b.inp, "%s: batch %d .inp" % (what, k))
            L.same(a.tgt, b.tgt, "%s: batch %d .tgt" % (what, k))
            T.check(b.pinned == 0, "%s: pin_memory() called %d times" % (what, b.pinned))
            n += 1
        T.check(n == len(r) == 12, "%s: %d batches, torch %d" % (what, n, len(r)))


def none_for_some(samples):
    """collate_fn returning None for the batches holding a multiple of 5: torch yields None."""
    if any(int(x[0][0, 0]) % 5 == 0 for x in samples):  # (sample i's x[0][0, 0] is i)
        return None
    return torch.stack([x[0] for x in samples]), torch.tensor([x[1] for x in samples])


def none_for_one(sample):
    """A per-sample collate_fn (batch_size=None): None for a multiple of 5, else a dict."""
    x, k = sample
    return None if int(x[0, 0]) % 5 == 0 else {"x": x * 2, "k": k}


class Count(IterableDataset):
    def __iter__(self):
        return iter(range(23))


@case
def collate_fn_returns_none():
    """A collate_fn's None is a batch, yielded as torch yields it (not taken for a batch that
    on_error skipped); with batch_size=None torch calls collate_fn on each sample."""
    for workers in (0, 1, 2):
        for mode in ("processes", "threads"):
            kw = {"worker_mode": mode}
            if mode == "threads" and workers == 0:
                continue
            what = "None batches workers=%d %s" % (workers, mode)
            ref, got = pair(Rows(), stoke_kw=kw, batch_size=3, collate_fn=none_for_some,
                            num_workers=workers)
            check_len(ref, got, what)
            r, g = epoch(ref), epoch(got)
            T.check(sum(b is None for b in r) == 9, "%s: torch gave %d None" % (
                what, sum(b is None for b in r)))
            check_sequential(r, g, what)
            what = "per-sample collate_fn workers=%d %s" % (workers, mode)
            ref, got = pair(Rows(), stoke_kw=kw, batch_size=None, collate_fn=none_for_one,
                            num_workers=workers)
            check_len(ref, got, what)
            check_sequential(epoch(ref), epoch(got), what)
            if workers <= 1:  # an iterable's stream is each worker's: one worker keeps the order
                what = "iterable per-sample collate_fn workers=%d %s" % (workers, mode)
                ref, got = pair(Count(), stoke_kw=kw, batch_size=None, num_workers=workers,
                                collate_fn=lambda i: None if i % 5 == 0 else [i])
                check_sequential(epoch(ref), epoch(got), what)


L.run_cases()
