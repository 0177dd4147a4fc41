"""Pinned memory given back while an asynchronous copy from it may be queued (python/fence.c):
`x = x.to("cuda", non_blocking=True)` drops the host batch at once, and its block went back to
the pool, where a worker wrote a later batch into it before the GPU's copy, queued behind the
work before it, had read it.  Now each pinned block given back waits for its release fence (the
package's records a torch.cuda.Event on the current stream; no CUDA here, so the test installs
fences it completes itself, on the simulated accelerator's pinned memory):
  - a batch's bytes stay as they were while its fence is not done (the drop-in with a Python
    dataset at 0 and 2 workers, and a source string's DLPack tensors), and every batch of the
    epoch is right;
  - fences never done by themselves: the loader waits for the oldest (synchronize) beyond the
    buffers it can spare and finishes the epoch (no hang), each batch once;
  - fences done: their blocks go back to the loader (none is kept fenced at the end);
  - no buffer to spare (buffers = held + 1): each release waits for its fence;
  - the caller holding batches beside the fenced ones: next() waits for a fence, never
    "all N batch buffers are held"; fenced batches are not copied out as held ones are, and
    at most 8 wait;
  - a PinnedBuffer (a held batch's copy) given back is not handed out again before its fence;
  - a fence factory that raises: reported (unraisable), the memory given back at once;
  - the loader's end (del) gives its fenced batches back after waiting for them;
  - a batch given back after its loader went waits for its own fence, and its buffer goes."""
import ctypes
import gc
import sys

import stoke_testlib as T

T.no_forked_python_under_tsan()
T.use_simdev()
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402

torch, stoke = L.torch, L.stoke
np = T.need("numpy")
_stoke = stoke._stoke

ROW = 1024  # float32 values a sample


class Fence:
    """A copy the test completes: query() says whether it is done, synchronize() waits."""
    made = []

    def __init__(self):
        self.done = self.waited = False
        Fence.made.append(self)

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = self.done = True


def fences(on=True):
    Fence.made.clear()
    _stoke._set_release_fence(Fence if on else None)


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((ROW,), float(i)), i


def watch_epoch(loader, complete_after=None, first=lambda b: b[0]):
    """Iterates one epoch dropping each batch at once (as `x = x.to(..., non_blocking=True)`
    does; the loader's iterator keeps no reference to a batch it delivered), and after each
    step checks that every batch whose fence is not done still holds its bytes.
    complete_after=k: the fence of the batch k steps back is done then (before the batch of
    the step is dropped).  Returns (batches, checks made, fences waited for)."""
    watched = []  # [fence, address, bytes, the bytes, batch]
    checks = 0
    it = iter(loader)
    n = 0
    while True:
        made = len(Fence.made)
        try:
            b = next(it)
        except StopIteration:
            # (the block of the epoch's end mark given back, fenced, or none)
            T.check(len(Fence.made) <= made + 1, "the epoch's end: %d fences made"
                    % (len(Fence.made) - made))
            break
        x = first(b)
        watched.append([None, x.data_ptr(), x.numel() * x.element_size(),
                        x.numpy().tobytes(), n])
        if complete_after is not None and len(watched) > complete_after + 1:
            watched[-2 - complete_after][0].done = True
        made = len(Fence.made)
        del b, x
        # the batch given back as it is dropped, first: fenced
        T.check(len(Fence.made) == made + 1, "batch %d given back: %d fences made, not 1"
                % (n, len(Fence.made) - made))
        watched[-1][0] = Fence.made[made]
        for f, p, nb, w, k in watched:
            if f is not None and not f.done:
                checks += 1
                T.check(ctypes.string_at(p, nb) == w, "batch %d's block was written while "
                        "its copy was in flight (its fence not done), at step %d" % (k, n))
        n += 1
    del it
    return n, checks, sum(f.waited for f, *_ in watched)


@case
def dropin_batches_wait_for_their_fences():
    for nw in (0, 2):
        fences()
        loader = L.Loader(Rows(), batch_size=4, num_workers=nw, pin_memory=True)
        n, checks, waited = watch_epoch(loader)
        T.check(n == 16 and checks > 0, "%d workers: %d batches, %d checks" % (nw, n, checks))
        T.check(waited > 0, "%d workers: no fence waited for: the loader would have stalled"
                % nw)
        # (the values of every batch: the epoch again, fences done at once)
        fences(False)
        got = sorted(int(v) for x, y in loader for v in y)
        T.check(got == list(range(64)), "%d workers: samples %s" % (nw, got))
        del loader


@case
def fences_done_give_the_blocks_back():
    for nw in (0, 2):
        fences()
        loader = L.Loader(Rows(), batch_size=4, num_workers=nw, pin_memory=True)
        n, checks, waited = watch_epoch(loader, complete_after=0)
        T.check(n == 16, "%d workers: %d batches" % (nw, n))
        # (at most the last batch's: the end mark's block given back beside it, at 0 workers
        # one more than the one buffer to spare)
        T.check(waited <= 1, "%d workers: %d fences waited for, though each was done at the "
                "next step" % (nw, waited))
        for f in Fence.made:
            f.done = True
        it = iter(loader)
        b = next(it)  # (next() gives back the batches whose fences are done)
        T.check(loader._outstanding == 1, "%d workers: %d batches out, the one held alone"
                % (nw, loader._outstanding))
        del b, it, loader


@case
def source_string_dlpack_tensors():
    _, _, dp, lp = T.make_npy(np, n=64, row_floats=ROW)
    fences()
    loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=4, num_workers=2,
                              prefetch_factor=2,
                              structure="list")
    n, checks, waited = watch_epoch(loader)
    T.check(n == 16 and checks > 0 and waited > 0, "npy: %d batches, %d checks, %d waited"
            % (n, checks, waited))
    del loader
    gc.collect()


@case
def no_buffer_to_spare_waits_at_the_release():
    """Buffers = those the caller may hold + 1 (1 worker, prefetch_factor=1): no buffer may
    wait fenced, so a release waits for its fence (synchronize) and then gives the buffer back.
    Until 2026-12-07 such a release skipped the fence: the buffer went back at once, for a
    worker to write, and a buffer pinned on use to be registered again, under the copy."""
    _, _, dp, lp = T.make_npy(np, n=64, row_floats=ROW)
    fences()
    loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=4, num_workers=1,
                              prefetch_factor=1, structure="list")
    T.check(loader.stats()["buffers"] == 3, "buffers: %d" % loader.stats()["buffers"])
    n, checks, waited = watch_epoch(loader)
    T.check(n == 16 and waited == 16, "no buffer to spare: %d batches, %d fences waited for at "
            "their release" % (n, waited))
    del loader
    fences(False)


@case
def batches_held_beside_fenced_ones():
    """The caller holding batches (the last 3, list(loader)) while others wait for their
    fences: next() waits for the oldest fence rather than raise "all N batch buffers are held
    by the caller" (fenced buffers come back by themselves)."""
    _, _, dp, lp = T.make_npy(np, n=64, row_floats=ROW)
    fences()
    loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=4, num_workers=2,
                              prefetch_factor=2, structure="list")
    last, n = [], 0
    for b in loader:
        last = (last + [b])[-3:]
        n += 1
    T.check(n == 16, "npy, the last 3 held: %d batches" % n)
    del last, b, loader
    for nw in (0, 2):
        fences()
        loader = L.Loader(Rows(), batch_size=4, num_workers=nw, pin_memory=True)
        got = sorted(int(v) for x, y in list(loader) for v in y)
        T.check(got == list(range(64)), "%d workers, list(loader): %s" % (nw, got))
        del loader
    fences(False)


@case
def fenced_batches_are_not_copied_out():
    """The drop-in copies a batch out of its block when the caller holds nearly every buffer;
    fenced batches (given back, their copies in flight) do not count as held: a plain loop
    whose GPU lags makes no copy."""
    fences()
    loader = L.Loader(Rows(), batch_size=4, num_workers=2, pin_memory=True)
    w = loader._writer
    copies = []
    decode_copy = w.decode_copy
    w.decode_copy = lambda b: copies.append(1) or decode_copy(b)
    n = 0
    for x, y in loader:
        T.check(loader._fenced <= 8, "%d batches fenced, more than 8" % loader._fenced)
        n += 1
    T.check(n == 16 and not copies, "%d batches, %d copied out" % (n, len(copies)))
    del loader, w, decode_copy
    fences(False)


@case
def pinned_buffer_not_reused_before_its_fence():
    _stoke._settle_pinned(True)  # (the held batches' copies of the cases before: freed)
    fences()
    buf = _stoke.PinnedBuffer(1 << 20)
    T.check(buf.pinned, "the simulated accelerator's PinnedBuffer is not pinned")
    view = memoryview(buf).cast("B")
    view[:] = b"\x5a" * (1 << 20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    del view, buf
    T.check(len(Fence.made) == 1, "%d fences for one PinnedBuffer" % len(Fence.made))
    others = [_stoke.PinnedBuffer(1 << 20) for _ in range(4)]
    for o in others:
        v = memoryview(o).cast("B")
        T.check(ctypes.addressof(ctypes.c_char.from_buffer(v)) != addr,
                "a PinnedBuffer was handed out again while its fence was not done")
        v[:] = b"\x00" * (1 << 20)
        del v
    T.check(ctypes.string_at(addr, 1 << 20) == b"\x5a" * (1 << 20),
            "a fenced PinnedBuffer's bytes changed")
    Fence.made[0].done = True
    T.check(_stoke._settle_pinned(False) == 0, "a done fence's PinnedBuffer still waits")
    del others
    fences(False)


@case
def a_failing_fence_is_reported_and_gives_back():
    seen = []
    old = sys.unraisablehook
    # (the message only: the exception's traceback holds the frames, and they the batches)
    sys.unraisablehook = lambda u: seen.append(str(u.exc_value))

    def broken():
        raise RuntimeError("no fence today")
    try:
        _stoke._set_release_fence(broken)
        loader = L.Loader(Rows(), batch_size=4, num_workers=0, pin_memory=True)
        got = sorted(int(v) for x, y in loader for v in y)
        T.check(got == list(range(64)), "samples %s" % got)
        T.check(loader._outstanding == 0, "%d batches out" % loader._outstanding)
        T.check(seen and all("no fence today" in e for e in seen),
                "the fence's error was not reported: %r" % seen[:3])
        del loader
    finally:
        sys.unraisablehook = old
        _stoke._set_release_fence(None)


@case
def the_loaders_end_waits_for_its_fenced_batches():
    fences()
    loader = L.Loader(Rows(), batch_size=4, num_workers=2, pin_memory=True)
    it = iter(loader)
    for _ in range(3):
        b = next(it)
        del b
    T.check(loader._outstanding == 3, "%d batches out, 3 fenced" % loader._outstanding)
    del it, loader
    gc.collect()
    T.check(len(Fence.made) == 3 and all(f.waited for f in Fence.made),
            "the loader's end: fences %s" % [(f.done, f.waited) for f in Fence.made])
    fences(False)


@case
def a_batch_given_back_after_its_loader_went_waits_for_its_fence():
    # (the loader's other buffers go back when it goes, and a batch given back after that is
    # not left in the fence list, which no next() looks at any more: its buffer goes too)
    fences()
    base = stoke.pinned_stats()["bytes_in_use"]
    loader = L.Loader(Rows(), batch_size=4, num_workers=2, pin_memory=True)
    it = iter(loader)
    kept = [next(it) for _ in range(3)]
    one = (stoke.pinned_stats()["bytes_in_use"] - base) // loader.stats()["buffers"]
    del it, loader
    gc.collect()
    T.check(not Fence.made, "fences made before any batch was given back")
    T.check(stoke.pinned_stats()["bytes_in_use"] - base == 3 * one,
            "3 batches kept: %d bytes in use, a buffer is %d"
            % (stoke.pinned_stats()["bytes_in_use"] - base, one))
    a = kept.pop()
    del kept
    gc.collect()
    T.check(len(Fence.made) == 2 and all(f.waited for f in Fence.made),
            "given back after the loader went: fences %s"
            % [(f.done, f.waited) for f in Fence.made])
    T.check(stoke.pinned_stats()["bytes_in_use"] - base == one,
            "one batch kept: %d bytes in use, a buffer is %d"
            % (stoke.pinned_stats()["bytes_in_use"] - base, one))
    T.check(a[0][:, 0].tolist() == [8.0, 9.0, 10.0, 11.0], "batch 2: %s" % a[0][:, 0].tolist())
    del a
    gc.collect()
    T.check(stoke.pinned_stats()["bytes_in_use"] == base, "a batch's buffer not given back")
    fences(False)


if __name__ == "__main__":
    L.run_cases()
