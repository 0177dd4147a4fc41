"""Zero copy for a Python dataset (issue 27), on the simulated accelerator (simdev) so that
batches come from the pinned pool: every tensor of a yielded batch -- a tuple from
default_collate, a dict from a collate_fn, a custom batch type's attributes -- views one block
of pinned memory (the leaves at distinct places inside it, each with a storage of its own, its
bytes), batches held past the loader's buffers copied tensor by tensor into pinned memory, the
pinned allocator's bytes (in use and registered) cover the held batches, nothing fell back to pageable memory, and the values are the dataset's.  A custom batch
type's pin_memory() is called once per batch, as torch does when it pins."""
import collections
import gc
import warnings

import stoke_testlib as T

T.no_forked_python_under_tsan()

T.use_simdev()
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402

torch, stoke = L.torch, L.stoke
from torch.utils.data import Dataset  # noqa: E402


class Samples(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return (torch.arange(3 * 16 * 16, dtype=torch.float32).view(3, 16, 16) + i,
                i, torch.full((5,), i, dtype=torch.int16))


def storage(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


def check_own_storages(tensors, what):
    """Each tensor has a storage of its own, its bytes exactly (as torch's batches: a label
    saved or sent carries the label, not the batch)."""
    for t in tensors:
        T.check(storage(t) == (t.data_ptr(), t.numel() * t.element_size()),
                "%s: a tensor of %d bytes at %#x has the storage (at, bytes) (%#x, %d)" % (
                    what, t.numel() * t.element_size(), t.data_ptr(), *storage(t)))


def check_one_block(tensors, what):
    """check_own_storages, and the tensors lie at distinct non-overlapping places of one block
    (the batch's); returns the span (start, bytes) they cover in it."""
    check_own_storages(tensors, what)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
    base, end = spans[0][0], spans[-1][1]
    packed = sum(hi - lo + 4096 for lo, hi in spans)  # (each leaf aligned in the block)
    T.check(end - base <= packed, "%s: the tensors span %d bytes, more than one block of "
            "theirs would (%d)" % (what, end - base, packed))
    for (a, b), (c, d) in zip(spans, spans[1:]):
        T.check(b <= c, "%s: tensors overlap: [%#x, %#x) and [%#x, %#x)" % (what, a, b, c, d))
    return base, end - base


def pinned_bytes(stats):
    """Pinned memory: the pool's blocks in use and memory registered with the backend (the
    process workers' shared blocks)."""
    return stats["bytes_in_use"] + stats["registered_bytes"]


@case
def default_collate_batches():
    for workers in (0, 2):
        what = "tuple batches workers=%d" % workers
        before = stoke.pinned_stats()
        loader = L.Loader(Samples(), batch_size=8, num_workers=workers, pin_memory=True)
        held, n = [], 0  # the last batch (the caller holds no more: none is copied)
        for k, b in enumerate(loader):
            x, y, z = b
            T.check(all(type(t) is torch.Tensor for t in b), "%s: %s" % (what, L.describe(b)))
            block = check_one_block([x, y, z], "%s batch %d" % (what, k))
            want = torch.stack([Samples()[i][0] for i in range(8 * k, 8 * k + 8)])
            T.check(torch.equal(x, want) and y.tolist() == list(range(8 * k, 8 * k + 8))
                    and torch.equal(z[:, 0], y.to(torch.int16)), "%s: values of batch %d" % (
                        what, k))
            held = [(b, block)]
            n += 1
        T.check(n == 12, "%s: %d batches" % (what, n))
        blocks = [blk for _, blk in held]
        now = stoke.pinned_stats()
        held_bytes = sum(n for _, n in blocks)
        T.check(pinned_bytes(now) - pinned_bytes(before) >= held_bytes,
                "%s: pinned bytes (in use + registered) %d -> %d while %d batches of %d bytes "
                "are held" % (what, pinned_bytes(before), pinned_bytes(now), len(held),
                              blocks[0][1]))
        for (b, _), w in zip(held, (11,)):
            T.check(b[1].tolist() == list(range(8 * w, 8 * w + 8)), "%s: held batch %d" % (what, w))
        T.check(now["pageable_fallbacks"] == before["pageable_fallbacks"],
                "%s: %d pageable fallbacks" % (what, now["pageable_fallbacks"]))
        print("  %s: blocks of %d bytes, pinned bytes (in use + registered) %d -> %d" % (
            what, blocks[0][1], pinned_bytes(before), pinned_bytes(now)))
        del held, b, x, y, z, loader
        gc.collect()


@case
def held_batches_copied_leaf_by_leaf():
    """A caller that holds every batch (list(loader)) gets the batches past the loader's
    buffers copied, each tensor into pinned memory of its own (so that a part kept keeps only
    itself: a loop keeping the labels kept a copy of every whole batch), with the values."""
    for workers in (0, 2):
        what = "list(loader) workers=%d" % workers
        before = stoke.pinned_stats()
        loader = L.Loader(Samples(), batch_size=8, num_workers=workers, pin_memory=True)
        batches = list(loader)
        for k, (x, y, z) in enumerate(batches):
            T.check(y.tolist() == list(range(8 * k, 8 * k + 8)) and int(x[0, 0, 0, 0]) == 8 * k
                    and z[:, 0].tolist() == y.tolist(), "%s: batch %d" % (what, k))
            check_own_storages([x, y, z], "%s batch %d" % (what, k))
        copied = len(batches) - int(loader.stats()["buffers"])
        T.check(stoke.pinned_stats()["pageable_fallbacks"] == before["pageable_fallbacks"],
                "%s: pageable fallbacks" % what)
        # the copies: the labels kept alone keep their batches' small leaves (a buffer of a
        # batch's under 16 KiB: 64 + 80 bytes, aligned), not the batches (25 KiB each)
        labels = [b[1] for b in batches]
        del batches, x, y, z, loader
        gc.collect()
        held = stoke._stoke.PinnedBuffer.held()[1]
        del labels
        gc.collect()
        kept = held - stoke._stoke.PinnedBuffer.held()[1]
        T.check(copied > 0 and 64 * copied <= kept <= 1024 * copied,
                "%s: the labels of %d batches copied keep %d bytes" % (what, copied, kept))


def dict_collate(batch):
    return {"x": torch.stack([s[0] for s in batch]),
            "meta": {"y": torch.tensor([s[1] for s in batch])},
            "z": torch.cat([s[2] for s in batch])}


class Pair:
    def __init__(self, batch):
        self.inp = torch.stack([s[0] for s in batch])
        self.tgt = torch.tensor([s[1] for s in batch])
        self.pinned = 0

    def pin_memory(self):
        self.pinned += 1
        return self


@case
def collate_fn_output():
    """A collate_fn's output (a dict, a custom batch type) is written once into the block."""
    what = "collate_fn dict workers=2"
    loader = L.Loader(Samples(), batch_size=8, num_workers=2, pin_memory=True,
                      collate_fn=dict_collate)
    for k, b in enumerate(loader):
        check_one_block([b["x"], b["meta"]["y"], b["z"]], "%s batch %d" % (what, k))
        T.check(b["meta"]["y"].tolist() == list(range(8 * k, 8 * k + 8)), "%s: %d" % (what, k))
    what = "custom batch type workers=2"
    loader = L.Loader(Samples(), batch_size=8, num_workers=2, pin_memory=True, collate_fn=Pair)
    n = 0
    for k, b in enumerate(loader):
        T.check(type(b) is Pair, "%s: a %s" % (what, type(b).__name__))
        check_one_block([b.inp, b.tgt], "%s batch %d" % (what, k))
        T.check(b.tgt.tolist() == list(range(8 * k, 8 * k + 8)), "%s: batch %d" % (what, k))
        T.check(b.pinned == 1, "%s: pin_memory() called %d times (torch: once when pinning)" % (
            what, b.pinned))
        n += 1
    T.check(n == 12, "%s: %d batches" % (what, n))


class Stub:
    """An object with pin_memory(), counting its calls."""

    def __init__(self):
        self.pinned = 0

    def pin_memory(self):
        self.pinned += 1
        return self


class NoInitMapping(collections.abc.Mapping):
    """A Mapping whose type cannot be made from a dict (torch falls back to a dict)."""

    def __init__(self, d, extra):
        self.d = d

    def __getitem__(self, k):
        return self.d[k]

    def __iter__(self):
        return iter(self.d)

    def __len__(self):
        return len(self.d)


class Batch(dict):
    pass


NT = collections.namedtuple("NT", "a b")


def shape_of(x):
    """A structure's types, nested, and whether each Stub was pinned (torch's fallbacks for a
    type that cannot be made again pin its items twice; stoke's once)."""
    if isinstance(x, Stub):
        return ("Stub", x.pinned > 0)
    if isinstance(x, collections.abc.Mapping):
        return (type(x).__name__, {k: shape_of(v) for k, v in x.items()})
    if isinstance(x, (list, tuple, collections.deque, collections.UserList)):
        return (type(x).__name__, [shape_of(v) for v in x])
    return (type(x).__name__, x if isinstance(x, (str, bytes, int, range)) else None)


@case
def pin_structure_as_torch():
    """A collate_fn's output, pinned (pin_memory=True), has the structure torch's pin_memory()
    gives it (torch.utils.data._utils.pin_memory): a Mapping keeps its type (OrderedDict, a dict
    subclass, UserDict; a dict where the type cannot be made from one: defaultdict), any
    Sequence its type (deque, UserList; a list for range), a tuple becomes a list, a
    namedtuple stays, and objects with pin_memory() inside any of them are pinned once (stoke
    made every Mapping a dict, kept tuples, and did not look inside a UserDict or a deque).
    Compared with torch's function on the same structures without tensors (torch's would pin
    a tensor with the accelerator's runtime); a tensor stays itself (it is in the pinned
    block)."""
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin
    from stoke import _dropin
    makes = [
        lambda: collections.OrderedDict(a="s", b=1, c=Stub()),
        lambda: collections.defaultdict(list, a=Stub()),
        lambda: Batch(a=Stub(), b=[Stub(), (Stub(), b"x")]),
        lambda: ("s", 1, Stub(), None),
        lambda: NT(Stub(), ("t", Stub())),
        lambda: collections.UserDict(a=Stub()),
        lambda: collections.UserList([Stub(), {"k": Stub()}]),
        lambda: collections.deque([Stub(), collections.deque([Stub()])]),
        lambda: NoInitMapping({"a": Stub()}, 0),
        lambda: range(3),
        lambda: [Stub(), "str", b"bytes", None, 2.5],
        Stub,
    ]
    for make in makes:
        src = make()
        want, got = shape_of(torch_pin(make())), shape_of(_dropin._pin_custom(src))
        T.check(got == want, "%s: %s, torch's %s" % (type(src).__name__, got, want))
    got = _dropin._pin_custom(collections.defaultdict(list, a=Stub(), b=[Stub()]))
    T.check(type(got) is dict and got["a"].pinned == 1 and got["b"][0].pinned == 1,
            "defaultdict: pin_memory() called %d, %d times" % (got["a"].pinned,
                                                              got["b"][0].pinned))
    t = torch.ones(2)
    got = _dropin._pin_custom({"t": (t, "s")})
    T.check(type(got["t"]) is list and got["t"][0] is t, "a tensor inside: %s" % (got,))

    def collate(batch):
        return collections.OrderedDict(
            x=torch.stack([s[0] for s in batch]),
            pair=(torch.tensor([s[1] for s in batch]), "s"),
            more=collections.UserDict(stub=Stub()))

    for workers in (0, 2):
        b = next(iter(L.Loader(Samples(), batch_size=8, num_workers=workers, pin_memory=True,
                               collate_fn=collate)))
        what = "collate_fn workers=%d" % workers
        T.check(type(b) is collections.OrderedDict and type(b["pair"]) is list
                and type(b["more"]) is collections.UserDict and b["more"]["stub"].pinned == 1,
                "%s: %s, pinned %d" % (what, L.describe(b), b["more"]["stub"].pinned))
        check_one_block([b["x"], b["pair"][0]], what)


class Named(Dataset):
    """Sample i: (i, a name, a float tensor); with stub, a dict holding a Stub too."""

    def __init__(self, stub=False):
        self.stub = stub

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if self.stub:
            return {"i": i, "stub": Stub(), "pair": (torch.ones(2) * i, "s%d" % i)}
        return (i, "s%d" % i, torch.ones(3) * i)


@case
def pin_builtin_collation_as_torch():
    """Without a collate_fn the pinned batch has the structure torch's pin_memory() gives
    default_collate's (default_convert's) output too: torch pins every batch, so a str column
    of tuple samples (zip's tuple) is a list, and with batch_size=None an object with
    pin_memory() in the sample has it called once.  stoke pinned only a collate_fn's output:
    the column stayed a tuple, the object unpinned.  Compared with torch's function (tensors
    left as they are: torch's would pin them with CUDA) over torch's unpinned batches."""
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    def shape(b):  # shape_of, with each tensor's values
        if isinstance(b, torch.Tensor):
            return ("Tensor", str(b.dtype), b.tolist())
        if isinstance(b, dict):
            return ("dict", {k: shape(v) for k, v in b.items()})
        if isinstance(b, (list, tuple)):
            return (type(b).__name__, [shape(v) for v in b])
        return shape_of(b)

    orig = torch.Tensor.pin_memory
    for kw in ({"batch_size": 4}, {"batch_size": None}):
        ds = Named(stub=kw["batch_size"] is None)
        torch.Tensor.pin_memory = lambda self, device=None: self  # (no CUDA here)
        try:
            want = [shape(torch_pin(b)) for b in L.TorchLoader(ds, **kw)]
        finally:
            torch.Tensor.pin_memory = orig
        for workers in (0, 2):
            what = "%s workers=%d" % (kw, workers)
            got = [shape(b) for b in L.Loader(ds, num_workers=workers, pin_memory=True,
                                              **kw)]
            T.check(got == want, "%s: %s, torch's %s" % (what, got[:1], want[:1]))


@case
def memory_flat_over_epochs():
    """Batches released as they come: the pinned bytes in use do not grow from epoch to
    epoch."""
    loader = L.Loader(Samples(), batch_size=8, num_workers=2, pin_memory=True, shuffle=True)
    use = []
    for e in range(4):
        n = sum(len(b[1]) for b in loader)
        T.check(n == 96, "epoch %d: %d samples" % (e, n))
        gc.collect()
        use.append(pinned_bytes(stoke.pinned_stats()))
    T.check(use[3] <= use[1], "pinned bytes grow over epochs: %s" % use)


@case
def spilled_batches_pinned():
    """A batch that outgrew its block (made by its worker in memory of its own) reaches the
    caller in pinned memory, as every other: copied into stoke's pinned pool, no pageable
    fallback, the values the dataset's."""
    for workers in (0, 2):
        what = "spilled batches workers=%d" % workers
        before = stoke.pinned_stats()
        loader = L.Loader(Samples(), batch_size=8, num_workers=workers, pin_memory=True,
                          max_batch_bytes=4096)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for k, (x, y, z) in enumerate(loader):
                held = stoke._stoke.PinnedBuffer.held()[1]
                T.check(y.tolist() == list(range(8 * k, 8 * k + 8))
                        and int(x[0, 0, 0, 0]) == 8 * k, "%s: batch %d" % (what, k))
                check_one_block([x, y, z], "%s batch %d" % (what, k))
                T.check(held >= x.numel() * 4, "%s batch %d: %d bytes of pinned copies held" % (
                    what, k, held))
        T.check(k == 11 and any("more than a block" in str(m.message) for m in w),
                "%s: %d batches, warnings %s" % (what, k + 1, [str(m.message) for m in w]))
        T.check(stoke.pinned_stats()["pageable_fallbacks"] == before["pageable_fallbacks"],
                "%s: pageable fallbacks" % what)
        del loader, x, y, z
        gc.collect()


L.run_cases()
