"""A batch outlives its DataLoader while a tensor (or array, or capsule) holds it, and its
memory returns to the pool only when the last holder lets go (pinned_stats: bytes_in_use); the
loader's other buffers return when the loader goes."""
import gc

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
T.use_simdev()
import stoke  # noqa: E402


def in_use():
    gc.collect()
    return stoke.pinned_stats()["bytes_in_use"]


base = in_use()
data, labels, dp, lp = T.make_npy(np, n=64)
for holder in ("torch", "numpy", "buffer", "capsule"):
    loader = stoke.DataLoader("npy:" + dp, batch_size=16, shuffle=True, seed=2, num_workers=2)
    held = in_use()
    T.check(held > base, "%s: the loader's buffers are not in the pinned pool" % holder)
    nbuf = loader.stats()["buffers"]
    T.check(nbuf > 1 and (held - base) % nbuf == 0, "%s: %d buffers, %d bytes"
            % (holder, nbuf, held - base))
    one = (held - base) // nbuf
    b = next(iter(loader))
    idx = np.from_dlpack(b.indices).copy()
    if holder == "torch":
        keep = torch.from_dlpack(b["data"])
    elif holder == "numpy":
        keep = np.from_dlpack(b["data"])
    elif holder == "buffer":
        keep = memoryview(b["data"])
    else:
        keep = b["data"].__dlpack__()  # an unconsumed capsule owns the memory too
    ptr = b.data_ptr()
    del b, loader
    # the viewed batch's buffer stays, the loader's others go with it (before 2026-12-07 they
    # stayed until the view went)
    T.check(in_use() - base == one, "%s: %d bytes in use while a batch is viewed, its buffer "
            "is %d (of %d in all)" % (holder, in_use() - base, one, held - base))
    if holder == "capsule":
        del keep
    else:
        got = np.asarray(keep)
        T.check(got.ctypes.data == ptr, "%s: not the batch's memory" % holder)
        T.check(np.array_equal(got, data[idx]), "%s: values changed after the loader went" % holder)
        del got, keep
    T.check(in_use() == base, "%s: memory not returned: %d bytes in use, %d before"
            % (holder, in_use(), base))
print("ok")

# A cycle through a batch (the batch stored on its own loader) is collected: the batch is
# returned and the loader destroyed by gc.
loader = stoke.DataLoader("npy:" + dp, batch_size=16, num_workers=2)
loader.last = next(iter(loader))
loader.last_data = loader.last["data"]
del loader
T.check(in_use() == base, "a batch in a cycle with its loader was never collected: %d bytes "
        "in use, %d before" % (in_use(), base))
print("ok (cycle)")
