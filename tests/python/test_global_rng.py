"""A Python dataset that reseeds torch's global RNG per item (torch.manual_seed(i) then draws,
as torchvision's FakeData does) delivers exactly ds[i] for every sample with 2 worker threads:
__getitem__ calls (with the conversion and copy) run one at a time.  (Before: 24-210 of 512
labels differed, the threads' seed-and-draw sequences interleaving.)  A Python dataset on more
than one thread gives one stoke.ThreadsWarning per process; on one thread none."""
import threading
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402

N = 512


class Reseeding:
    """torch.manual_seed(i) + torch.randint per item."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        torch.manual_seed(i)
        x = torch.randint(0, 1 << 30, (16,))
        y = torch.randint(0, 1000, (1,))[0]
        return x, y


class FakeDataLike:
    """torchvision.datasets.FakeData's __getitem__ (without torchvision): the global RNG saved,
    reseeded with the index, drawn from, restored."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        state = torch.get_rng_state()
        torch.manual_seed(i)
        img = torch.randn(3, 8, 8)
        target = torch.randint(0, 10, size=(1,), dtype=torch.long)[0]
        torch.set_rng_state(state)
        return img, target


def check_exact(ds):
    loaded = {}
    loader = stoke.DataLoader(ds, batch_size=8, num_workers=2, pin_memory=False)
    for b in loader:
        idx = np.from_dlpack(b.indices).copy()
        x = torch.from_dlpack(b["data"]).clone()
        y = torch.from_dlpack(b["label"]).clone()
        for k, i in enumerate(idx):
            loaded[int(i)] = (x[k], y[k])
        del b
    T.check(sorted(loaded) == list(range(N)), "indices delivered: %d" % len(loaded))
    bad = [i for i in range(N)
           if not (torch.equal(loaded[i][0], ds[i][0]) and torch.equal(loaded[i][1], ds[i][1]))]
    T.check(not bad, "%s: %d of %d samples differ from ds[i], e.g. %s"
            % (type(ds).__name__, len(bad), N, bad[:8]))


with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    one = stoke.DataLoader(Reseeding(), batch_size=8, num_workers=1, pin_memory=False)
    T.check(not [x for x in w if issubclass(x.category, stoke.ThreadsWarning)],
            "a warning for one thread: %s" % [str(x.message) for x in w])
    check_exact(Reseeding())
    check_exact(FakeDataLike())
    stoke.DataLoader(FakeDataLike(), batch_size=8, num_workers=3, pin_memory=False)
mine = [str(x.message) for x in w if issubclass(x.category, stoke.ThreadsWarning)]
T.check(len(mine) == 1, "ThreadsWarnings: %s" % mine)
T.check(issubclass(stoke.ThreadsWarning, RuntimeWarning), "not a RuntimeWarning")
T.check("python:Reseeding" in mine[0] and "2 worker threads" in mine[0], mine[0])
del one


# num_workers=1: one thread calls __getitem__ (the loader does not also call it from the
# consumer's thread), so even unseeded global-RNG draws come in one order; 0: the caller's
class Threads:
    def __init__(self):
        self.idents = set()

    def __len__(self):
        return 256

    def __getitem__(self, i):
        self.idents.add(threading.get_ident())
        return np.full(2, i, dtype=np.int64)


for workers in (0, 1):
    ds = Threads()
    loader = stoke.DataLoader(ds, batch_size=1, num_workers=workers, pin_memory=False)
    ds.idents.clear()  # construction read ds[0] in this thread
    n = 0
    for b in loader:
        n += len(b)
        del b
    T.check(n == 256, "samples %d" % n)
    main = threading.get_ident() in ds.idents
    T.check(len(ds.idents) == 1 and main == (workers == 0),
            "num_workers=%d: __getitem__ ran on %d thread(s), main thread %s"
            % (workers, len(ds.idents), main))
print("ok")
