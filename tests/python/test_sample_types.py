"""Every kind of sample a Python dataset can return arrives as torch.utils.data.DataLoader
delivers it (default_collate's structure, types, dtypes, shapes and the values bit for bit):
NumPy arrays and NumPy scalars of every dtype, torch tensors of every dtype (0-d, transposed,
empty), Python int/float/bool, str and bytes (lists), dicts (also OrderedDict, defaultdict),
namedtuples, tuples and lists, nested -- each as an entry of one dict sample, and as the whole
sample; by worker processes, worker threads, the caller's thread, and with batch_size=None
(default_convert).  A kind torch refuses raises torch's exception type, except None, Python
complex, arbitrary objects and NumPy arrays of objects or text: stoke passes those through as
a list of the samples' own objects, where torch raises TypeError.  (Before the drop-in:
stoke.Batch fields, and a TypeError for dicts, str and None.)"""
import collections
import re

import stoke_testlib as T

T.no_forked_python_under_tsan()

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import stoke  # noqa: E402

N, BS = 16, 4
Point = collections.namedtuple("Point", ["x", "y"])
NP_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                torch.complex128]


def np_values(dt, i, shape=(3, 2)):
    if dt == "bool":
        return (np.arange(6) % (i + 2) == 0).reshape(shape)
    if dt.startswith(("int", "uint")):
        v = [k * (i + 1) - 5 for k in range(6)]
        if dt.startswith("uint"):  # values past the signed maximum too
            v = [abs(x) + (np.iinfo(dt).max - 40 if i == 3 else 0) for x in v]
        elif i == 5:
            v = [x + np.iinfo(dt).min + 40 for x in v]
        return np.array(v, dtype=dt).reshape(shape)
    a = (np.arange(6, dtype=np.float64) * (i + 1) - 5 + 0.25 * (i % 4)).astype(dt)
    if dt.startswith("complex"):
        a = a + 1j * a[::-1]
    return a.reshape(shape)


def torch_values(dt, i):
    if dt == torch.bool:
        return torch.arange(6).view(3, 2) % (i + 2) == 0
    v = torch.arange(6, dtype=torch.float64).view(3, 2) * (i + 1) - (0 if dt == torch.uint8 else 5)
    if dt.is_complex:
        return torch.complex(v, -v).to(dt)
    return v.to(dt)


# (name, make(i)): every kind of leaf
KINDS = [("np_" + dt, lambda i, dt=dt: np_values(dt, i)) for dt in NP_DTYPES]
KINDS += [("np_scalar_" + dt, lambda i, dt=dt: np_values(dt, i, shape=(6,))[i % 6])
          for dt in NP_DTYPES]
KINDS += [("torch_" + str(dt)[6:], lambda i, dt=dt: torch_values(dt, i)) for dt in TORCH_DTYPES]
KINDS += [
    ("np_0d", lambda i: np.array(i * 1.5, dtype=np.float32)),
    ("np_empty", lambda i: np.zeros((0, 3), dtype=np.int32)),
    ("np_transposed", lambda i: np_values("float32", i).T),
    ("np_big_endian", lambda i: np_values("int32", i).astype(">i4")),
    ("np_strided", lambda i: np_values("int64", i)[::2]),
    ("torch_0d", lambda i: torch.tensor(i * 2.5)),
    ("torch_empty", lambda i: torch.zeros(2, 0)),
    ("torch_transposed", lambda i: torch_values(torch.float32, i).t()),
    ("torch_slice", lambda i: torch.arange(10)[i % 3:i % 3 + 4]),
    ("int", lambda i: i * 1000 - 7),
    ("int_big", lambda i: 2**40 + i),
    ("float", lambda i: i / 3 - 1.0),
    ("float_inf", lambda i: float("inf") if i % 2 else -0.0),
    ("bool", lambda i: i % 3 == 0),
    ("str", lambda i: "sample %d" % i),
    ("str_empty", lambda i: ""),
    ("bytes", lambda i: b"\x00\xff" * i),
    ("dict", lambda i: {"a": i, "b": np.full(2, i, dtype=np.int16), "c": {"d": "x%d" % i}}),
    ("ordereddict", lambda i: collections.OrderedDict([("z", i), ("a", float(i))])),
    ("defaultdict", lambda i: collections.defaultdict(int, {"k": i})),
    ("namedtuple", lambda i: Point(i, np.float32(i) / 2)),
    ("namedtuple_nested", lambda i: Point({"p": i}, [i, (i, "s")])),
    ("tuple", lambda i: (i, "t%d" % i, np.int8(i))),
    ("list", lambda i: [i, [i * 2.0, torch.tensor([i])]]),
    ("tuple_empty", lambda i: ()),
    # refused by torch's default_collate (TypeError): passed through by stoke as a list
    ("none", lambda i: None),
    ("complex", lambda i: complex(i, -i)),
    ("object", lambda i: Point),
    ("np_object", lambda i: np.array([None, i], dtype=object)),
    ("np_str", lambda i: np.array(["ab", "c%d" % i])),
    ("np_bytes", lambda i: np.array([b"ab", b"c"])),
]
PASS_THROUGH = {"none", "complex", "object", "np_object", "np_str", "np_bytes"}


class DS:
    def __init__(self, make):
        self.make = make

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.make(i)


def bits(t):
    t = t.detach().reshape(-1).contiguous()
    return t.view(torch.uint8) if t.dtype != torch.bool else t


DIFFS = []  # every difference from torch, reported together at the end


def differ(cond, what):
    if not cond:
        DIFFS.append(what)
    return not cond


def same(a, b, path):
    """a (stoke's) is b (torch's): types, keys, dtypes, shapes, bytes."""
    if differ(type(a) is type(b),
              "%s: %s, torch %s" % (path, type(a).__name__, type(b).__name__)):
        return
    if isinstance(b, torch.Tensor):
        if not differ(a.dtype == b.dtype and a.shape == b.shape,
                      "%s: %s %s, torch %s %s" % (path, a.dtype, tuple(a.shape), b.dtype,
                                                   tuple(b.shape))):
            differ(torch.equal(bits(a), bits(b)), "%s: values %s, torch %s" % (path, a, b))
    elif isinstance(b, dict):
        if not differ(list(a) == list(b), "%s: keys %s, torch %s" % (path, list(a), list(b))):
            for k in b:
                same(a[k], b[k], "%s[%r]" % (path, k))
    elif isinstance(b, (list, tuple)):
        if not differ(len(a) == len(b), "%s: length %d, torch %d" % (path, len(a), len(b))):
            for k, (x, y) in enumerate(zip(a, b)):
                same(x, y, "%s[%d]" % (path, k))
    elif isinstance(b, np.ndarray):
        differ(a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist(),
               "%s: %r, expected %r" % (path, a, b))
    else:
        differ(a == b or (a is None and b is None), "%s: %r, torch %r" % (path, a, b))


def torch_epoch(ds, **kw):
    """torch's batches (copied), or the exception it raised."""
    try:
        return [b for b in TorchLoader(ds, batch_size=BS, **kw)], None
    except Exception as e:  # noqa: BLE001 - compared with stoke's
        return None, e


def stoke_epoch(ds, **kw):
    """stoke's batches, each copied as it comes (its tensors view a slot that is reused)."""
    def copy(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, dict):
            out = {k: copy(v) for k, v in x.items()}
            try:
                return type(x)(out)
            except TypeError:
                return out
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(copy(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        return x
    kw.setdefault("batch_size", BS)
    try:
        return [copy(b) for b in stoke.DataLoader(ds, pin_memory=False, **kw)], None
    except Exception as e:  # noqa: BLE001
        return None, e


# which kinds this torch collates (uint16..uint64 arrays are refused by torch 1.x, ...)
accepted, refused = [], []
for name, make in KINDS:
    ref, err = torch_epoch(DS(make))
    (refused if err is not None else accepted).append((name, make, ref, err))
T.check(len(accepted) >= 50, "torch collates only %s" % [a[0] for a in accepted])
T.check(PASS_THROUGH <= {r[0] for r in refused}, "torch collates %s"
        % (PASS_THROUGH - {r[0] for r in refused}))

# 1. every accepted kind as an entry of one dict sample, in every worker mode
names = [a[0] for a in accepted]
makes = [a[1] for a in accepted]


def all_kinds(i):
    return {n: m(i) for n, m in zip(names, makes)}


ref, err = torch_epoch(DS(all_kinds))
T.check(err is None, "torch: %r" % err)
for kw in ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "threads"},
           {"num_workers": 0}):
    got, err = stoke_epoch(DS(all_kinds), **kw)
    if not differ(err is None, "all kinds %s: %s: %s" % (kw, type(err).__name__, err)):
        same(got, ref, "all kinds %s" % kw)

# 2. batch_size=None: default_convert of each sample
ref = [b for b in TorchLoader(DS(all_kinds), batch_size=None)]
got, err = stoke_epoch(DS(all_kinds), batch_size=None, num_workers=2)
if not differ(err is None, "batch_size=None: %s: %s" % (type(err).__name__, err)):
    same(got, ref, "batch_size=None")

# 3. each accepted kind as the whole sample
for name, make, ref, _ in accepted:
    got, err = stoke_epoch(DS(make), num_workers=2)
    if not differ(err is None, "%s: %s: %s" % (name, type(err).__name__, err)):
        same(got, ref, name)

# 4. each refused kind: torch's exception type, or (PASS_THROUGH) the samples as lists
for name, make, _, terr in refused:
    got, err = stoke_epoch(DS(make), num_workers=2)
    if name in PASS_THROUGH:
        if not differ(err is None, "%s: %s: %s" % (name, type(err).__name__, err)):
            same(got, [[make(i) for i in range(k, k + BS)] for k in range(0, N, BS)], name)
        got, err = stoke_epoch(DS(lambda i, make=make: {"i": i, "x": make(i)}), num_workers=2)
        if not differ(err is None, "{i, %s}: %s: %s" % (name, type(err).__name__, err)):
            same(got, [{"i": torch.arange(k, k + BS), "x": [make(i) for i in range(k, k + BS)]}
                       for k in range(0, N, BS)], "{i, %s}" % name)
    else:
        differ(type(err) is type(terr), "%s: %s %s, torch %s %s"
               % (name, type(err).__name__, err, type(terr).__name__, terr))
# one line per difference, its batches counted ("[k]": the batch, "values" kept whole)
lines = collections.Counter(re.sub(r"\[\d+\]", "[k]", d, count=1) if ": values" not in d
                            else d for d in DIFFS)
T.check(not DIFFS, "%d difference(s) from torch:\n  %s"
        % (len(DIFFS), "\n  ".join("%s  (x%d)" % (k, n) for k, n in lines.items())))
print("ok: %d kinds as torch collates them, %d refused (%s)"
      % (len(accepted), len(refused), ", ".join(r[0] for r in refused)))
