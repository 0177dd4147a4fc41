"""device=: batches are device buffers.  __dlpack_device__ names the device (simdev is not a
DLPack device type: kDLExtDev), __dlpack__ waits for the copy and exports the device address,
the buffer protocol refuses (no host memory to view), and the device buffers go back to the
pool when the batches are gone."""
import gc

import stoke_testlib as T

np = T.need("numpy")
T.use_simdev()
import stoke  # noqa: E402

K_DL_EXT_DEV = 12
loader = stoke.DataLoader("synthetic:40,shape=16,classes=4", batch_size=8, num_workers=2,
                          device="simdev")
n = 0
for b in loader:
    T.check(b.__dlpack_device__() == (K_DL_EXT_DEV, 0), "device %s" % (b.__dlpack_device__(),))
    T.check(b["label"].__dlpack_device__() == (K_DL_EXT_DEV, 0), "label device")
    T.check(b.indices.__dlpack_device__() == (1, 0), "indices are host memory")
    try:
        memoryview(b["data"])
        T.check(False, "a device batch gave a host buffer")
    except BufferError as e:
        T.check("device memory" in str(e), "message %s" % e)
    cap = b["data"].__dlpack__(stream=None)
    T.check(type(cap).__name__ == "PyCapsule", "not a capsule: %r" % cap)
    T.check(b.data_ptr("data") != 0 and b.data_ptr("label") >= b.data_ptr("data") + 8 * 16,
            "device addresses %x %x" % (b.data_ptr("data"), b.data_ptr("label")))
    T.check(np.array_equal(np.from_dlpack(b.indices), np.arange(n, n + 8)), "indices")
    n += 8
    del cap
T.check(n == 40, "samples %d" % n)
del b, loader
gc.collect()
print("ok")
