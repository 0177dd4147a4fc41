"""stoke.DataLoader against torch.utils.data.DataLoader where a review found them apart (issue
27's drop-in): each case runs the same dataset through both loaders, at 0 and 2 workers, and
compares what comes out (values, types) or what is raised (type, message)."""
import os
import sys
import threading

import stoke_testlib as T

T.no_forked_python_under_tsan()

np = T.need("numpy")
import dropin_lib as L  # noqa: E402

torch = L.torch


def outcome(make, nw, **kw):
    """The batches of one pass as lists, or (exception type, its message's first line)."""
    try:
        return [b.tolist() for b in make(nw, **kw)]
    except Exception as e:  # noqa: BLE001 - compared with torch's
        return (type(e), str(e).splitlines()[0] if str(e) else "")


@L.case
def plain_iterator_is_map_style():
    """A dataset that is no IterableDataset is map-style in torch, a generator object too:
    len() raises its TypeError.  stoke iterated it, each worker process its own copy (every
    item once per worker)."""
    def gen():
        for i in range(6):
            yield torch.tensor(i)

    for nw in (0, 2):
        for what, make in (("generator", gen), ("list_iterator", lambda: iter([1, 2, 3, 4]))):
            ref = outcome(lambda n: L.TorchLoader(make(), batch_size=2, num_workers=n), nw)
            got = outcome(lambda n: L.Loader(make(), batch_size=2, num_workers=n), nw)
            T.check(ref == (TypeError, "object of type '%s' has no len()" % what),
                    "torch %s workers=%d: %r" % (what, nw, ref))
            T.check(got == ref, "%s workers=%d: stoke %r, torch %r" % (what, nw, got, ref))


class Sub(torch.Tensor):
    pass


class Subclassed(torch.utils.data.Dataset):
    """Samples of a tensor subclass (or nn.Parameters), alone or in a dict; n floats each."""

    def __init__(self, kind, n):
        self.kind, self.n = kind, n

    def __len__(self):
        return 40

    def __getitem__(self, i):
        t = torch.arange(float(self.n)) + i
        if self.kind == "param":
            return torch.nn.Parameter(t, requires_grad=False)
        t = t.as_subclass(Sub)
        return {"x": t, "i": i} if self.kind == "dict" else t


@L.case
def tensor_subclass_kept_by_default_collate():
    """torch's default_collate stacks a subclass's samples with torch.stack, which keeps the
    subclass (an nn.Parameter's __torch_function__ is disabled: a plain tensor); stoke's
    num_workers=0 returned a plain torch.Tensor.  Every batch held at once (list(loader):
    the later ones copied out of the loader's blocks), small samples and big ones."""
    for kind in ("sub", "param", "dict"):
        for n in (3, 40000):
            what = "%s n=%d" % (kind, n)
            ref, got = L.pair(Subclassed(kind, n), batch_size=4, num_workers=0)
            r, s = list(ref), list(got)
            T.check(len(r) == len(s) == 10, "%s: %d batches, torch %d" % (what, len(s), len(r)))
            for k, (a, b) in enumerate(zip(r, s)):
                if kind == "dict":
                    T.check(torch.equal(a["i"], b["i"]), "%s batch %d: i" % (what, k))
                    a, b = a["x"], b["x"]
                T.check(type(b) is type(a), "%s batch %d: stoke %s, torch %s"
                        % (what, k, type(b).__name__, type(a).__name__))
                T.check(torch.equal(a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor)),
                        "%s batch %d: values" % (what, k))


class Locked(Exception):
    """An exception that does not pickle: its __init__ gives it a lock."""

    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


class LockedTwo(Exception):
    """One that does not pickle, and that its message alone does not make (two arguments)."""

    def __init__(self, msg, code):
        super().__init__(msg, code)
        self.lock = threading.Lock()


class Raises(torch.utils.data.Dataset):
    def __init__(self, cls):
        self.cls = cls

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.cls is Locked:
            raise Locked("bad record %d" % i)
        raise LockedTwo("bad record %d" % i, 7)


@L.case
def worker_exception_not_pickled_as_torch():
    """A worker's exception that does not pickle: torch's ExceptionWrapper raises
    exc_type("Caught <type> in DataLoader worker process <w>.\nOriginal <traceback>"), or a
    RuntimeError with that message when the type cannot be made from it.  stoke's worker made
    type(e)(str(e)) and, that not pickling either, sent a RuntimeError("Locked: ...")."""
    for cls in (Locked, LockedTwo):
        caught = []
        for make in (L.TorchLoader, L.Loader):
            try:
                list(make(Raises(cls), batch_size=4, num_workers=2))
                caught.append(None)
            except Exception as e:  # noqa: BLE001 - compared with torch's
                lines = str(e).rstrip().splitlines()
                if sys.version_info < (3, 11) and lines[-1].startswith("in stoke worker "):
                    lines.pop()  # (stoke's note, in the message where there is no add_note)
                caught.append((type(e), lines[0], lines[1], lines[-1]))
        ref, got = caught
        want = RuntimeError if cls is LockedTwo else cls
        T.check(ref is not None and ref[0] is want, "torch %s: %r" % (cls.__name__, ref))
        T.check(ref[1] == "Caught %s in DataLoader worker process 0." % cls.__name__
                and ref[2] == "Original Traceback (most recent call last):",
                "torch %s: %r" % (cls.__name__, ref))
        T.check(got == ref, "%s: stoke %r, torch %r" % (cls.__name__, got, ref))


class Keys(torch.utils.data.Sampler):
    """Keys 3, 1, 4, 0, 2, 5 as kind makes them: int, NumPy scalars, 0-dim tensors, or a mix."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 6

    def __iter__(self):
        for n, i in enumerate((3, 1, 4, 0, 2, 5)):
            yield self.make(i, n)

    def make(self, i, n):
        k = self.kind
        if k == "mixed":
            k = "np.int64" if n % 2 else "int"
        if k == "int":
            return i
        if k.startswith("np."):
            return getattr(np, k[3:])(i)
        return torch.tensor(i, dtype=getattr(torch, k[6:]))


class KeyTypes(torch.utils.data.Dataset):
    """Sample i: the key's type (and dtype) as __getitem__ got it, and its value."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if isinstance(i, list):
            return [self[k] for k in i]
        name = type(i).__name__
        if isinstance(i, torch.Tensor):
            name += "/%s/%d" % (i.dtype, i.dim())
        return (name, int(i))


class SeenKeys(KeyTypes):
    """KeyTypes that appends each key's type name to a file, whatever process calls it."""

    def __init__(self, path):
        self.path = path

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(type(i).__name__ + "\n")
        return super().__getitem__(i)


@L.case
def sampler_keys_reach_getitem_as_given():
    """torch passes the sampler's keys to __getitem__ unchanged: NumPy integer scalars, 0-dim
    tensors, a static array's or tensor's elements (a SubsetRandomSampler over an array
    yields them).  stoke planned them as int64 and passed ints.  A pass of mixed types gets
    ints (stoke plans one type a pass)."""
    BS = torch.utils.data.BatchSampler
    samplers = [(k, lambda k=k: Keys(k)) for k in
                ("int", "np.int64", "np.int32", "np.uint8", "torch.int64", "torch.int32")]
    samplers += [("array", lambda: np.array([3, 1, 4, 0, 2, 5])),
                 ("tensor", lambda: torch.tensor([3, 1, 4, 0, 2, 5]))]
    for name, make in samplers:
        for nw in (0, 2):
            for kw in ({"batch_size": 2}, {"batch_size": None},
                       {"batch_sampler": "BS"}, {"batch_size": None, "sampler": "BS"}):
                what = "%s workers=%d %s" % (name, nw, kw)
                args = dict(kw)
                if args.get("batch_sampler") == "BS":
                    args["batch_sampler"] = BS(make(), 4, False)
                elif args.get("sampler") == "BS":
                    args["sampler"] = BS(make(), 4, False)
                else:
                    args["sampler"] = make()
                ref = list(L.TorchLoader(KeyTypes(), num_workers=nw, **args))
                got = list(L.Loader(KeyTypes(), num_workers=nw, **args))
                T.check(repr(got) == repr(ref), "%s: stoke %r, torch %r" % (what, got, ref))
    # measure()'s child (2 workers, no max_batch_bytes: it calls __getitem__ at the
    # construction) gets them as the workers do; it got ints (a dataset that needed its key's
    # type failed there, and the size measured was lost)
    seen = os.path.join(T.tmpdir(), "key_types")
    for name in ("np.int64", "torch.int32"):
        ds = SeenKeys(seen)
        got = [b for b in L.Loader(ds, sampler=Keys(name), batch_size=2, num_workers=2)]
        with open(seen) as f:
            kinds = set(f.read().split())
        os.unlink(seen)
        want = "int64" if name == "np.int64" else "Tensor"
        T.check(kinds == {want} and len(got) == 3, "%s, the probe's keys: %s" % (name, kinds))
    # mixed: the values are torch's, the keys ints
    got = list(L.Loader(KeyTypes(), sampler=Keys("mixed"), batch_size=None))
    T.check([list(x) for x in got] == [["int", i] for i in (3, 1, 4, 0, 2, 5)],
            "mixed: %r" % (got,))


class EpochSampler(torch.utils.data.Sampler):
    """Epoch e's order: 4 keys from 4 * e (mod 8); counts its passes."""

    def __init__(self):
        self.epoch, self.passes = 0, 0

    def set_epoch(self, e):
        self.epoch = e

    def __len__(self):
        return 4

    def __iter__(self):
        self.passes += 1
        return iter([(4 * self.epoch + i) % 8 for i in range(4)])


@L.case
def sampler_set_epoch_after_iter():
    """sampler.set_epoch(e) after iter(loader), before the first next(): torch's
    single-process iterator draws the sampler's indices lazily, so epoch e's order comes; its
    worker processes' iterator draws at iter() (prefetching), so the order set before.
    stoke read the sampler at iter() at both: one epoch late with num_workers=0."""
    for nw in (0, 2):
        out, passes = [], []
        for make in (L.TorchLoader, L.Loader):
            s = EpochSampler()
            loader = make(L.Indices(8), sampler=s, batch_size=2, num_workers=nw)
            got = []
            for e in range(3):
                it = iter(loader)
                s.set_epoch(e)
                got.append([b.tolist() for b in it])
            out.append(got)
            passes.append(s.passes)
        T.check(out[1] == out[0], "workers=%d: stoke %r, torch %r" % (nw, out[1], out[0]))
        T.check(passes[1] == passes[0] == 3, "workers=%d: sampler passes: stoke %d, torch %d"
                % (nw, passes[1], passes[0]))


@L.case
def stoke_set_epoch_after_an_unused_iter():
    """An iterator made and never used (num_workers=0: its plan left to its first next()),
    then stoke's own loader.set_epoch(e), which reads the sampler as it promises, then a pass:
    the sampler is read once for that epoch, and the pass is the order set_epoch read (the
    iterator's pending plan replaced it with a second read: a stateful sampler moved twice)."""
    for nw in (0, 2):
        s = EpochSampler()
        loader = L.Loader(L.Indices(8), sampler=s, batch_size=2, num_workers=nw)
        iter(loader)
        s.set_epoch(1)
        loader.set_epoch(1)
        read = s.passes
        s.set_epoch(0)  # (a second read now would give epoch 0's order)
        got = [b.tolist() for b in loader]
        T.check(got == [[4, 5], [6, 7]], "workers=%d: %r" % (nw, got))
        T.check(s.passes == read, "workers=%d: sampler read %d times, %d before the pass"
                % (nw, s.passes, read))


class FailsOnce(torch.utils.data.Sampler):
    """Its first pass raises; later ones give 0..3."""

    def __init__(self):
        self.passes = 0

    def __len__(self):
        return 4

    def __iter__(self):
        self.passes += 1
        if self.passes == 1:
            raise ValueError("sampler broke")
        return iter(range(4))


@L.case
def sampler_raising_at_first_next():
    """With num_workers=0 the sampler is read at the first next(), as torch's: its error is
    raised there, the pass is then over (StopIteration), and the next pass reads it again."""
    out = []
    for make in (L.TorchLoader, L.Loader):
        loader = make(L.Indices(4), sampler=FailsOnce(), batch_size=2)
        it = iter(loader)
        seen = []
        for _ in range(2):
            try:
                seen.append(next(it).tolist())
            except StopIteration:
                seen.append("StopIteration")
            except Exception as e:  # noqa: BLE001 - compared with torch's
                seen.append("%s: %s" % (type(e).__name__, e))
        seen.append([b.tolist() for b in loader])
        out.append(seen)
    T.check(out[0] == ["ValueError: sampler broke", "StopIteration", [[0, 1], [2, 3]]],
            "torch: %r" % (out[0],))
    T.check(out[1] == out[0], "stoke %r, torch %r" % (out[1], out[0]))


@L.case
def numpy_scalar_column_promotes_as_torch():
    """A column of NumPy scalars is torch.as_tensor(batch) in default_collate: mixed types
    (an np.float32 label beside a Python float, an np.int32 beside an np.float32, an
    np.float16 beside a float) promote as torch promotes them, to float32; stoke made NumPy's
    array of them first, float64.  One type alone (and one beside a Python int) is that
    type's dtype, as before."""
    for name, vals in (("np.float32, float", [np.float32(1.5), 2.25]),
                       ("np.int32, np.float32", [np.int32(1), np.float32(2.5)]),
                       ("np.float16, float", [np.float16(1.5), 0.1]),
                       ("np.float64, np.float32", [np.float64(1.5), np.float32(2.5)]),
                       ("np.int64, int", [np.int64(3), 2]),
                       ("np.float32", [np.float32(0.5), np.float32(2)]),
                       ("np.bool_", [np.bool_(True), np.bool_(False)])):
        for nw in (0, 2):
            got, ref = ([(b.dtype, b.tolist()) for b in make(vals * 3, batch_size=4,
                                                              num_workers=nw)]
                        for make in (L.Loader, L.TorchLoader))
            T.check(got == ref, "%s workers=%d: stoke %s, torch %s" % (name, nw, got, ref))


@L.case
def multiprocessing_context_checked_as_torch():
    """multiprocessing_context is checked as torch's: any value with num_workers=0 is
    torch's ValueError (stoke took "fork" there), a name that is no start method torch's
    ValueError, an object that is neither a name nor a context torch's TypeError (stoke's
    was a ValueError); None and "fork" with workers work, "spawn" and "forkserver" are
    stoke's own ValueError."""
    import multiprocessing as mp

    def made(make, nw, ctx):
        try:
            make(L.Indices(4), batch_size=2, num_workers=nw, multiprocessing_context=ctx)
        except Exception as e:  # noqa: BLE001 - compared with torch's
            return type(e), str(e)
        return "made"

    for nw, ctx in ((0, "fork"), (0, mp.get_context("fork")), (0, "spawn"), (2, "bogus"),
                    (2, 5), (2, b"fork"), (2, "fork"), (2, mp.get_context("fork")), (0, None),
                    (2, None)):
        got, ref = made(L.Loader, nw, ctx), made(L.TorchLoader, nw, ctx)
        T.check(got == ref, "workers=%d %r: stoke %r, torch %r" % (nw, ctx, got, ref))
    got = made(L.Loader, 2, "spawn")
    T.check(got[0] is ValueError and "forked" in got[1], "workers=2 'spawn': %r" % (got,))



@L.case
def iter_datapipe_sharded_and_seeded_as_torch():
    """An IterDataPipe is set up by torch's DataLoader: shuffle= turns its Shuffler on or off,
    each pass seeds its random pipes from a seed drawn from the generator (the same in every
    worker), and each worker process gets its share of a sharding_filter.  stoke refused
    shuffle=, and its workers each iterated the whole pipe (every item once per worker), each
    shuffling in its own order.  The batches of three passes and the global RNG after them are
    torch's, with and without a generator and persistent workers."""
    try:
        from torch.utils.data.datapipes.iter import IterableWrapper
    except ImportError:  # (a torch without DataPipes)
        return

    def run(make, nw, **kw):
        torch.manual_seed(3)
        if kw.pop("gen", False):
            kw["generator"] = torch.Generator().manual_seed(5)
        loader = make(IterableWrapper(range(12)).shuffle().sharding_filter(), batch_size=4,
                      num_workers=nw, **kw)
        return [[b.tolist() for b in loader] for _ in range(3)] + [torch.rand(1).item()]

    for nw, kw in ((0, {}), (0, {"shuffle": False}), (2, {}), (2, {"shuffle": True}),
                   (2, {"shuffle": False, "gen": True}), (2, {"persistent_workers": True}),
                   (2, {"persistent_workers": True, "gen": True})):
        got, ref = run(L.Loader, nw, **kw), run(L.TorchLoader, nw, **kw)
        T.check(got == ref, "workers=%d %s: stoke %s, torch %s" % (nw, kw, got, ref))
    # a state taken inside a pass (num_workers=0: an IterableDataset's position is kept)
    # restores the pass's order, its Shuffler seeded as it was, not with a new draw
    loader = L.Loader(IterableWrapper(range(12)).shuffle(), batch_size=3)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    again = L.Loader(IterableWrapper(range(12)).shuffle(), batch_size=3)
    again.load_state_dict(state)
    got = [b.tolist() for b in again]
    T.check(got == rest, "restored after %s: %s, the pass went on with %s" % (head, got, rest))



@L.case
def too_many_workers_warn_as_torch():
    """More worker processes than the CPUs the process may run on: torch's DataLoader warns
    when it is made ("This DataLoader will create N worker processes in total. Our suggested
    max number of worker ..."); stoke's said nothing.  As many as the CPUs: no warning."""
    import warnings
    cpus = len(os.sched_getaffinity(0))

    def told(make, nw):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            loader = make(L.Indices(4 * nw), batch_size=2, num_workers=nw)
            made = [str(w.message) for w in ws if "worker processes in total" in str(w.message)]
            T.check(sum(len(b) for b in loader) == 4 * nw, "%s: a pass" % make.__name__)
        return made

    for nw in (cpus, cpus + 1):
        got, ref = told(L.Loader, nw), told(L.TorchLoader, nw)
        T.check(len(ref) == (nw > cpus), "torch, %d workers on %d CPUs: %s" % (nw, cpus, ref))
        T.check(got == ref, "%d workers on %d CPUs: stoke %s, torch %s" % (nw, cpus, got, ref))


L.run_cases()
