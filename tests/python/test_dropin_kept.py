"""What the drop-in keeps for batches made in this process, and when it lets go.

1. Batch 0 made at construction (num_workers=0) failed to collate into its probe block: the
   first next() raises its error (or set_epoch drops it).
   Once the caller handled it, batch 0's probe block is freed at once (no cycle through the
   kept error's traceback left for the cyclic GC).
2. Worker threads prefetch batches whose structures wait in _Writer.live until decoded (a
   structure with a string: one of containers and tensors only goes in the block, MAGIC_FAST):
   set_epoch and a new iterator (which abandon the run) drop those never decoded, and a full
   epoch leaves nothing behind."""
import gc
import threading
import time
import weakref

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402
from stoke import _dropin  # noqa: E402

# -- 1. the failed batch 0's probe block --
probes = []
orig_probe = _dropin._probe_block


def recording_probe(make, live=None):
    def mk(blk):
        probes.append(weakref.ref(blk))
        return make(blk)
    return orig_probe(mk, live)


_dropin._probe_block = recording_probe


class Bad:
    """Sample 1's shape differs: collating batch 0 into its probe block fails."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(5 if i == 1 else 4, i, dtype=np.float32)


for case in ("fill", "set_epoch"):
    probes.clear()
    gc.collect()
    gc.disable()
    try:
        loader = stoke.DataLoader(Bad(), batch_size=4, num_workers=0)
        T.check(probes, "%s: batch 0 was not made in a probe block" % case)
        if case == "fill":
            try:
                next(iter(loader))
                T.check(False, "fill: batch 0 did not raise")
            except RuntimeError as e:  # torch's: stack expects each tensor to be equal size
                T.check("size" in str(e), "fill: not batch 0's error: %r" % e)
        else:  # batch 0 never delivered: dropped by set_epoch
            loader.set_epoch(1)
        alive = sum(r() is not None for r in probes)
        T.check(alive == 0, "%s: %d of batch 0's probe blocks alive after the error was handled "
                "(a cycle left to the GC)" % (case, alive))
        del loader
    finally:
        gc.enable()
print("ok (probe block)")
_dropin._probe_block = orig_probe


# -- 2. structures of batches made and never decoded --
class Gated:
    """Sample i is (i, its name); once `open` is cleared, fills wait for it."""

    def __init__(self):
        self.open = threading.Event()
        self.open.set()
        self.timeouts = 0

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if not self.open.wait(30):
            self.timeouts += 1
        return np.full(2, i, dtype=np.int64), "s%d" % i


def wait_live(writer, n, what):
    t0 = time.monotonic()
    while len(writer.live) < n and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    T.check(len(writer.live) >= n, "%s: the workers prefetched %d batches, not %d"
            % (what, len(writer.live), n))


for restart in ("set_epoch", "iter"):
    ds = Gated()
    loader = stoke.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="threads",
                              prefetch_factor=4)
    w = loader._writer
    it = iter(loader)
    first = next(it)
    T.check(first[0].tolist() == [[i, i] for i in range(4)]
            and list(first[1]) == ["s%d" % i for i in range(4)],
            "%s: batch 0 %s" % (restart, first))
    wait_live(w, 4, restart)  # prefetched, never decoded
    hook = w.set_epoch

    def closing_hook(epoch, unused=0):
        # called by the restart once no fill is in progress: the next run's fills wait, so
        # what live holds after the restart is exact
        ds.open.clear()
        return hook(epoch, unused)

    w.set_epoch = closing_hook
    if restart == "set_epoch":
        loader.set_epoch(1)
        it = iter(loader)
    else:
        it = iter(loader)  # not fresh: the next epoch, the run abandoned
    T.check(len(w.live) == 0, "%s: %d structures of abandoned batches kept"
            % (restart, len(w.live)))
    ds.open.set()
    got = sorted(int(x) for b in it for x in b[0][:, 0])
    T.check(got == list(range(256)), "%s: the next epoch's samples are wrong" % restart)
    T.check(len(w.live) == 0, "%s: %d structures kept after a full epoch" % (restart,
                                                                            len(w.live)))
    T.check(ds.timeouts == 0, "%s: %d fills waited 30 s for the gate" % (restart, ds.timeouts))
    del it, loader, first
print("ok (live)")
