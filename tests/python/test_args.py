"""Out-of-range arguments raise, naming the argument and its range, instead of wrapping
silently: rank=-2 / -7 (was: the environment's rank, 0), rank >= world_size, world_size < 1,
timeout >= 2^32 ms or negative, seed=2**64 (was 0) and seed=-1 (was 2^64 - 1).  The same
checks in _stoke.Loader (the C type behind DataLoader).  Valid edges still work."""
import stoke_testlib as T

T.need("numpy")
import stoke  # noqa: E402

SRC = "synthetic:12,shape=4"


def raises(kw, exc, *words, cls=stoke.DataLoader):
    try:
        cls(SRC, num_workers=0, pin_memory=False, **kw)
    except exc as e:
        for w in words:
            T.check(w in str(e), "%s: %r lacks %r" % (kw, str(e), w))
        return
    except Exception as e:  # noqa: BLE001
        T.check(False, "%s: %s %s, not %s" % (kw, type(e).__name__, e, exc.__name__))
    T.check(False, "%s: accepted" % kw)


for rank in (-2, -7, -1):
    raises(dict(rank=rank, world_size=4), ValueError, "rank", "0 .. world_size - 1")
    raises(dict(rank=rank), ValueError, "rank")
raises(dict(rank=4, world_size=4), ValueError, "rank", "world_size - 1 = 3")
for ws in (0, -3):
    raises(dict(rank=0, world_size=ws), ValueError, "world_size", ">= 1")
raises(dict(timeout=2**32 / 1000.0), ValueError, "timeout", "4294967.295 seconds")
raises(dict(timeout=1e12), ValueError, "timeout", "seconds")
raises(dict(timeout=-1), ValueError, "timeout", "seconds")
raises(dict(timeout=float("inf")), ValueError, "timeout")
raises(dict(timeout=float("nan")), ValueError, "timeout")
raises(dict(seed=2**64), ValueError, "seed", "0 .. 2**64 - 1")
raises(dict(seed=-1), ValueError, "seed", "0 .. 2**64 - 1")
raises(dict(seed=2**70), ValueError, "seed", "0 .. 2**64 - 1")
raises(dict(seed=1.5), TypeError, "seed")

# the C type takes timeout_ms and the C sentinels (-1 / 0: from the environment)
C = stoke._stoke.Loader
raises(dict(timeout_ms=2**32), ValueError, "timeout_ms", "2**32 - 1", cls=C)
raises(dict(timeout_ms=-1), ValueError, "timeout_ms", cls=C)
raises(dict(seed=-1), ValueError, "seed", cls=C)
raises(dict(seed=2**64), ValueError, "seed", cls=C)
raises(dict(distributed=True, rank=-2, world_size=4), ValueError, "rank", cls=C)
raises(dict(distributed=True, rank=2, world_size=-1), ValueError, "world_size", cls=C)

# the edges that are valid
a = stoke.DataLoader(SRC, num_workers=0, pin_memory=False, seed=2**64 - 1, shuffle=True,
                     timeout=(2**32 - 1) / 1000.0)
T.check(a.state_dict()["seed"] == 2**64 - 1, "seed %r" % a.state_dict()["seed"])
b = stoke.DataLoader(SRC, num_workers=0, pin_memory=False, rank=3, world_size=4)
T.check((b.rank, b.world_size) == (3, 4), "rank %d/%d" % (b.rank, b.world_size))
T.check(len(b) == 3, "rank 3 of 4 of 12 samples: %d batches" % len(b))
# source= (stoke 0.1's keyword) alone, without the positional dataset; neither: a TypeError
c = stoke.DataLoader(source=SRC, batch_size=4, num_workers=0, pin_memory=False)
T.check(sum(1 for _ in c) == len(c) > 0, "source=: %d batches" % len(c))
try:
    stoke.DataLoader(batch_size=4)
    T.check(False, "no dataset: nothing raised")
except TypeError as e:
    T.check("needs a dataset" in str(e), str(e))
# a source string has torch's attributes too, as given or resolved (a script that reads
# loader.persistent_workers or loader.pin_memory ran into AttributeError)
for kw, want in (({}, dict(persistent_workers=False, prefetch_factor=None, pin_memory=False,
                           timeout=0, generator=None, sampler=None, batch_sampler=None,
                           collate_fn=None, worker_init_fn=None, multiprocessing_context=None,
                           pin_memory_device="")),
                 (dict(num_workers=2), dict(persistent_workers=True, prefetch_factor=2)),
                 (dict(num_workers=2, persistent_workers=False, prefetch_factor=3, timeout=5),
                  dict(persistent_workers=False, prefetch_factor=3, timeout=5))):
    kw = dict(dict(num_workers=0, pin_memory=False), **kw)
    loader = stoke.DataLoader(SRC, batch_size=4, **kw)
    for name, v in want.items():
        T.check(getattr(loader, name, "<missing>") == v and
                type(getattr(loader, name, None)) is type(v),
                "%s: loader.%s is %r, not %r" % (kw, name, getattr(loader, name, "<missing>"), v))
    del loader
# _passes_go_on (the drop-in sets it from torch's persistent_workers): a bool to set, not to
# delete; a value whose truth raises passes that error on and changes nothing
loader = stoke.DataLoader(SRC, batch_size=4, num_workers=0, pin_memory=False)
loader._passes_go_on = True
T.check(loader._passes_go_on is True, "_passes_go_on set: %r" % loader._passes_go_on)


class Bad:
    def __bool__(self):
        raise ZeroDivisionError("no truth")


for how, exc in ((lambda: delattr(loader, "_passes_go_on"), TypeError),
                 (lambda: setattr(loader, "_passes_go_on", Bad()), ZeroDivisionError)):
    try:
        how()
        T.check(False, "%s: accepted" % exc.__name__)
    except exc:
        pass
    T.check(loader._passes_go_on is True, "_passes_go_on kept: %r" % loader._passes_go_on)
loader._passes_go_on = 0
T.check(loader._passes_go_on is False, "_passes_go_on cleared: %r" % loader._passes_go_on)
del loader
print("ok")
