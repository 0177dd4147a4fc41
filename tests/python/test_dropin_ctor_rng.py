"""Making a stoke.DataLoader over a Python dataset leaves every RNG as torch's constructor leaves
it: torch's, Python's and NumPy's global RNGs and the loader's generator are where they were
before it (the construction draws what torch's iter() and first next() draw -- the base seed,
the sampler's order, batch 0 with num_workers=0 -- and sets them back).  Before, it moved
torch's by the base seed's draw and more: a model made after the loader got other weights than
under torch, and a second loader's construction (train and validation) made the first one draw
its seeds again, so its workers' seeds and its augmentations were not torch's.

Checked against torch.utils.data.DataLoader in the same process, same seeds:
  1. the RNG states right after construction, for map-style and iterable datasets, 0 and 2
     workers, shuffle, a sampler, a generator;
  2. seed, loader, model (nn.Linear(3, 1): as many draws as the construction made, so the
     states after both are equal -- it must still count as moved), epoch: the weights, the
     batches of a dataset drawing from torch's RNG, the RNG after;
  3. train and validation loaders made one after the other, iterated in turn for 2 epochs,
     0 and 2 workers: the batches (with get_worker_info().seed in them) and the RNG after;
  4. a dataset that draws nothing: batch 0 made at construction is delivered when no RNG moved
     (each sample fetched once), made again when one did;
  5. a dataset drawing from a generator of its own that the script reseeds after making the
     loader: batch 0 made again (delivering the construction's was a review's finding)."""
import random

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data import Dataset, IterableDataset, RandomSampler  # noqa: E402
from torch.utils.data import TensorDataset, get_worker_info  # noqa: E402

import stoke  # noqa: E402


def seed_all(s):
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def states():
    return (torch.get_rng_state(), random.getstate(), np.random.get_state())


def same_states(a, b):
    return (torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0]
            and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:])


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    return a == b


def kept(batches):
    return [[x.clone() if isinstance(x, torch.Tensor) else x for x in b] for b in batches]


class Augmented(Dataset):
    """Draws from torch's, Python's and NumPy's global RNGs; says its worker's seed."""

    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return (torch.tensor(i), torch.rand(2), torch.tensor(random.random()),
                torch.tensor(np.random.rand()), torch.tensor(info.seed if info else 0))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


class Plain(Dataset):
    """Draws from no RNG; counts its calls."""

    def __init__(self):
        self.calls = []

    def __len__(self):
        return 12

    def __getitem__(self, i):
        self.calls.append(i)
        return torch.full((2,), float(i))


bad = []

# 1. the states right after construction
for name, make in (
        ("map, 0 workers", lambda L: L(Augmented(), batch_size=4)),
        ("map, 2 workers", lambda L: L(Augmented(), batch_size=4, num_workers=2)),
        ("map, shuffle, 0 workers", lambda L: L(Augmented(), batch_size=4, shuffle=True)),
        ("map, shuffle, 2 workers persistent",
         lambda L: L(Augmented(), batch_size=4, shuffle=True, num_workers=2,
                     persistent_workers=True)),
        ("TensorDataset, 2 workers",
         lambda L: L(TensorDataset(torch.arange(40.).view(20, 2)), batch_size=4,
                     num_workers=2)),
        ("RandomSampler", lambda L: L(Augmented(), batch_size=4,
                                      sampler=RandomSampler(range(12)))),
        ("iterable, 2 workers", lambda L: L(Stream(), batch_size=4, num_workers=2)),
        ("collate_fn", lambda L: L(Augmented(), batch_size=4, collate_fn=lambda s: len(s)))):
    for L in (TorchLoader, stoke.DataLoader):
        seed_all(0)
        before = states()
        loader = make(L)
        if not same_states(states(), before):
            bad.append("%s: %s's construction moved the global RNGs" % (name, L.__module__))
        del loader
for nw in (0, 2):
    g = torch.Generator().manual_seed(7)
    before = g.get_state()
    loader = stoke.DataLoader(Augmented(), batch_size=4, shuffle=True, generator=g,
                              num_workers=nw)
    T.check(torch.equal(g.get_state(), before),
            "generator, %d workers: the construction moved the loader's generator" % nw)
    # its first pass draws the base seed from it then, as torch's iter() does (and nothing
    # else: stoke's shuffle is keyed by its initial seed, docs/python.md)
    ref_g = torch.Generator().manual_seed(7)
    torch.empty((), dtype=torch.int64).random_(generator=ref_g)
    list(loader)
    T.check(torch.equal(g.get_state(), ref_g.get_state()),
            "generator, %d workers: a pass did not draw the base seed from it" % nw)
    del loader

# 2. seed, loader, model, epoch
for nw in (0, 2):
    out = []
    for L in (TorchLoader, stoke.DataLoader):
        seed_all(0)
        loader = L(Augmented(), batch_size=2, num_workers=nw)
        model = torch.nn.Linear(3, 1)
        out.append((model.weight.detach().clone(), kept(loader), states()))
        del loader
    (w0, b0, s0), (w1, b1, s1) = out
    if not torch.equal(w0, w1):
        bad.append("model after the loader, %d workers: other weights than torch's" % nw)
    if not same(b0, b1):
        bad.append("model after the loader, %d workers: other batches than torch's" % nw)
    if not same_states(s0, s1):
        bad.append("model after the loader, %d workers: the RNGs after differ" % nw)

# 3. train and validation loaders
for nw in (0, 2):
    out = []
    for L in (TorchLoader, stoke.DataLoader):
        seed_all(1)
        # (a RandomSampler: shuffle=True is stoke's own permutation, docs/python.md)
        train = L(Augmented(8), batch_size=2, num_workers=nw, sampler=RandomSampler(range(8)))
        val = L(Augmented(6), batch_size=3, num_workers=nw)
        got = []
        for _ in range(2):
            got.append(kept(train))
            got.append(kept(val))
        out.append((got, states()))
        del train, val
    (b0, s0), (b1, s1) = out
    if not same(b0, b1):
        bad.append("train and validation, %d workers: other batches than torch's" % nw)
    if not same_states(s0, s1):
        bad.append("train and validation, %d workers: the RNGs after differ" % nw)

# 4. a dataset that draws from no global RNG: nothing moved, batch 0 made at construction is
# delivered (each sample fetched once, as torch fetches it); an RNG moved, it is made again (its
# samples fetched twice: a dataset may depend on an RNG without drawing from the global ones,
# as one reseeding a generator of its own, docs/python.md)
for move in (False, True):
    ref_ds, got_ds = Plain(), Plain()
    seed_all(2)
    ref = TorchLoader(ref_ds, batch_size=4)
    if move:
        torch.rand(5)
    ref_b = kept(ref)
    seed_all(2)
    got = stoke.DataLoader(got_ds, batch_size=4)
    if move:
        torch.rand(5)
    got_b = kept(got)
    T.check(same(ref_b, got_b), "Plain, moved %s: other batches than torch's" % move)
    want = list(range(12)) + ([0, 1, 2, 3] if move else [])
    T.check(sorted(got_ds.calls) == sorted(want) and sorted(ref_ds.calls) == list(range(12)),
            "Plain, moved %s: __getitem__ calls %s, torch's %s" % (move, got_ds.calls,
                                                                  ref_ds.calls))


# 5. a dataset drawing from a generator of its own, reseeded by the script after making the
# loader (with the global seed): batch 0 is made again, from the reseeded generator
class OwnGenerator(Dataset):
    def __init__(self):
        self.g = torch.Generator().manual_seed(0)

    def reseed(self, s):
        self.g.manual_seed(s)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(2, generator=self.g)


out = []
for L in (TorchLoader, stoke.DataLoader):
    ds = OwnGenerator()
    seed_all(3)
    loader = L(ds, batch_size=4)
    torch.manual_seed(4)
    ds.reseed(4)
    out.append(kept(loader))
    del loader
T.check(same(out[0], out[1]), "a generator of the dataset's own, reseeded: %s, torch's %s"
        % (out[1][:1], out[0][:1]))

T.check(not bad, "\n  ".join(["differences from torch:"] + bad))
print("ok")
