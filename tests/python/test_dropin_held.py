"""How many batch blocks process workers touch: the shared memory of a Python dataset's batches
(the memfd "stoke-batches") is resident once written, so the blocks in use at once are the
loader's peak memory.  With 2 workers and prefetch_factor 1 (the default for batches of 16 MiB
or more) at most 2 batches are in flight; a caller that drops each batch before asking for the
next holds none, and one that keeps it until the next arrives (`for x in loader:`) holds one:
3 blocks in both cases, not the 4 the ring has."""
import ctypes
import mmap

import stoke_testlib as T

torch = T.need("torch")
T.no_forked_python_under_tsan()
import stoke  # noqa: E402

SAMPLE = 4 << 20  # bytes: a batch of 4 is 16 MiB, a "big" block
BATCH = 4
N = 40


class Big:
    """Sample i: SAMPLE bytes of float32, all i; the workers are slower than the caller."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        import time
        time.sleep(0.01)
        return torch.full((SAMPLE // 4,), float(i))


def resident_bytes():
    """Resident bytes of this process's "stoke-batches" mapping, whoever wrote them: mincore
    reports the memfd's pages in memory, not only the ones this process touched."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "stoke-batches" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                spans.append((lo, hi))
    T.check(len(spans) == 1, "one stoke-batches mapping, not %r" % (spans,))
    lo, hi = spans[0]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (hi - lo) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    T.check(libc.mincore(lo, hi - lo, vec) == 0, "mincore: errno %d" % ctypes.get_errno())
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


def epoch(keep):
    loader = stoke.DataLoader(Big(), batch_size=BATCH, num_workers=2)
    seen = []
    if keep:  # the batch stays bound while the next is awaited
        for b in loader:
            seen.append(int(b[0, 0]))
    else:
        for b in loader:
            seen.append(int(b[0, 0]))
            del b
    T.check(seen == list(range(0, N, BATCH)), "keep=%d: batches %r" % (keep, seen))
    used = resident_bytes()
    batch = BATCH * SAMPLE
    T.check(used >= 2 * batch, "keep=%d: %d bytes resident, under 2 batches: mincore does not "
            "see the blocks" % (keep, used))
    T.check(used <= 3 * batch + (1 << 20),
            "keep=%d: %.1f batches of blocks resident (%d bytes), at most 3 expected"
            % (keep, used / batch, used))
    del loader


epoch(keep=False)
epoch(keep=True)
print("ok")
