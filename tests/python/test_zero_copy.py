"""Batches are views of the loader's pinned memory: torch.from_dlpack, numpy.from_dlpack and
numpy.asarray all give the batch's own address, and every delivered row equals the .npy row of
its index (each index once per epoch)."""
import stoke_testlib as T

np, torch = T.need("numpy", "torch")
T.use_simdev()
import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=100)
loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=8, shuffle=True, seed=5,
                          num_workers=2)
T.check(len(loader) == 13, "len %d" % len(loader))
T.check(loader.pinned_backend == "simdev", "pinned for %r" % loader.pinned_backend)
seen = []
for b in loader:
    T.check(b.is_pinned, "batch not pinned")
    idx = np.from_dlpack(b.indices)
    ptr = b.data_ptr("data")
    t = torch.from_dlpack(b["data"])
    a = np.asarray(b["data"])
    n = np.from_dlpack(b["data"])
    whole = torch.from_dlpack(b)  # the batch itself is its first field
    T.check(t.data_ptr() == ptr, "torch tensor is a copy")
    T.check(whole.data_ptr() == ptr, "torch tensor of the batch is a copy")
    T.check(a.ctypes.data == ptr, "numpy.asarray is a copy")
    T.check(n.ctypes.data == ptr, "numpy.from_dlpack is a copy")
    T.check(np.asarray(b).ctypes.data == ptr, "numpy.asarray(batch) is a copy")
    lab = torch.from_dlpack(b["label"])
    T.check(lab.data_ptr() == b.data_ptr("label"), "label tensor is a copy")
    T.check(t.dtype == torch.float32 and tuple(t.shape) == (len(b), 768), "shape %s" % (t.shape,))
    T.check(np.array_equal(a, data[idx]), "rows differ from the .npy at %s" % idx)
    T.check(np.array_equal(lab.numpy(), labels[idx]), "labels differ at %s" % idx)
    T.check(idx.ctypes.data == b.data_ptr("indices"), "indices are a copy")
    # Writes through one view are seen by the others: the same memory.
    a[0, 0] = 12345.0
    T.check(float(t[0, 0]) == 12345.0, "views do not share memory")
    seen.extend(idx.tolist())
T.check(sorted(seen) == list(range(100)), "indices of the epoch: %s" % sorted(seen))
T.check(seen != list(range(100)), "shuffle=True delivered the sequential order")

# DLPack 1.0 (versioned) capsules for consumers asking for them; copy=True is refused.
import ctypes  # noqa: E402


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype_code", ctypes.c_uint8), ("dtype_bits", ctypes.c_uint8),
                ("dtype_lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
b = next(iter(loader))
cap = b["data"].__dlpack__(max_version=(1, 0))
v = Versioned.from_address(api.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
t = v.dl_tensor
T.check((v.major, v.minor, v.flags) == (1, 0, 0), "version %d.%d" % (v.major, v.minor))
T.check(t.data == b.data_ptr() and t.device_type == 1 and t.ndim == 2, "versioned tensor")
T.check((t.shape[0], t.shape[1], t.strides[0], t.strides[1]) == (8, 768, 768, 1), "layout")
T.check((t.dtype_code, t.dtype_bits, t.dtype_lanes) == (2, 32, 1), "dtype")
try:
    b.__dlpack__(copy=True)
    T.check(False, "copy=True exported without a copy")
except BufferError:
    pass
del cap, v, t, b
print("ok")
