"""Samples whose tensors are not on the CPU (a TensorDataset of CUDA tensors; device "meta"
stands in for CUDA here: the same path, no GPU needed, no values to read) collate as torch's
DataLoader does with num_workers=0: stacked on their device, the CPU leaves beside them as
usual (stoke stacked them into the CPU block: "Expected out tensor to have device meta, but
got cpu instead"), and a collate_fn's device tensor is yielded as the object it returned. In
a worker process torch cannot collate them either: stoke raises a RuntimeError naming the
device."""
import os

import stoke_testlib as T

torch = T.need("torch")
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402
from torch.utils.data import Dataset, TensorDataset  # noqa: E402

import stoke  # noqa: E402

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)


class Mixed(Dataset):
    """Sample i: a meta tensor, a CPU tensor of i, the int i, a string."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"x": torch.ones(3, 2, device="meta"), "y": torch.full((2,), float(i)),
                "i": i, "name": "s%d" % i}


def check_like(ref, got, path="batch"):
    """got as ref: structure and types; meta tensors by device, dtype and shape, the others
    by value too."""
    if isinstance(ref, torch.Tensor) and ref.device.type != "cpu":
        T.check(type(got) is torch.Tensor, "%s: %s" % (path, L.describe(got)))
        T.check((got.device, got.dtype, got.shape) == (ref.device, ref.dtype, ref.shape),
                "%s: %s %s %s, torch %s %s %s" % (path, got.device, got.dtype,
                                                  tuple(got.shape), ref.device, ref.dtype,
                                                  tuple(ref.shape)))
    elif isinstance(ref, dict):
        T.check(type(got) is type(ref) and list(got) == list(ref), "%s: %s, torch %s" % (
            path, L.describe(got), L.describe(ref)))
        for k in ref:
            check_like(ref[k], got[k], "%s[%r]" % (path, k))
    elif isinstance(ref, (list, tuple)) and not isinstance(ref, str):
        T.check(type(got) is type(ref) and len(got) == len(ref), "%s: %s, torch %s" % (
            path, L.describe(got), L.describe(ref)))
        for i, (r, g) in enumerate(zip(ref, got)):
            check_like(r, g, "%s[%d]" % (path, i))
    else:
        L.same(ref, got, path)


def epochs(make, ds, n=2, **kw):
    loader = make(ds, **kw)
    return [[L.snapshot(b) for b in loader] for _ in range(n)]


@case
def tensor_dataset_on_device():
    ds = TensorDataset(torch.ones(8, 3, device="meta"), torch.arange(8))
    check_like(epochs(L.TorchLoader, ds, batch_size=4), epochs(stoke.DataLoader, ds, batch_size=4))
    # shuffled (the reviewer's case): stoke's own permutation, each label once an epoch
    for e in epochs(stoke.DataLoader, ds, batch_size=4, shuffle=True):
        T.check([(b[0].device.type, tuple(b[0].shape)) for b in e] == [("meta", (4, 3))] * 2,
                "%r" % [L.describe(b) for b in e])
        T.check(sorted(v for b in e for v in b[1].tolist()) == list(range(8)),
                "labels %r" % [b[1].tolist() for b in e])


@case
def mixed_leaves():
    for kw in ({}, {"shuffle": False, "drop_last": True, "batch_size": 3}):
        args = dict({"batch_size": 4}, **kw)
        check_like(epochs(L.TorchLoader, Mixed(), **args),
                   epochs(stoke.DataLoader, Mixed(), **args))


@case
def collate_fn_output_kept():
    made = []

    def to_meta(samples):
        made.append(torch.stack([s["y"] for s in samples]).to("meta"))
        return {"x": made[-1], "i": [s["i"] for s in samples]}

    loader = stoke.DataLoader(Mixed(), batch_size=5, collate_fn=to_meta)
    for _ in range(2):
        got = list(loader)
        T.check(len(got) == 2, "%d batches" % len(got))
        for b, m in zip(got, made[-2:]):
            T.check(b["x"] is m, "the batch's tensor is not the one collate_fn returned: %s"
                    % L.describe(b["x"]))
        T.check([b["i"] for b in got] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
                "%r" % [b["i"] for b in got])


@case
def workers_raise():
    if not PROCS:
        return
    for make in (L.TorchLoader, stoke.DataLoader):
        try:
            list(make(Mixed(), batch_size=4, num_workers=2))
        except RuntimeError as e:
            if make is stoke.DataLoader:  # (it was the out= tensor's device mismatch)
                T.check("device meta" in str(e) and "num_workers=0" in str(e),
                        "stoke's error: %s" % e)
        else:
            T.check(False, "%s: no error" % make.__module__)


L.run_cases()
