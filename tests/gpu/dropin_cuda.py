"""The drop-in DataLoader on a machine with a CUDA GPU (tests/gpu/run.sh runs it; issue 27's
checks that need the accelerator): from a parent that initialized CUDA and started torch's
intra-op pool before the loader (a real training process), with process workers,

  tensor   TensorDataset: batches equal torch's DataLoader's (sequential), every tensor pinned
           for CUDA (torch's own is_pinned()), copied to the GPU with non_blocking=True and back
           equal;
  dict     a Python __getitem__ returning a dict of tensors, a str and a number (process
           workers run it): the same structure and values as torch's, pinned;
  pad      token sequences of varying length padded by stoke itself (pad={"input_ids": 0}):
           the padded rows equal the sequences, the lengths field right, pinned;
  collate  the user's collate_fn (pad_sequence) in the workers: equal to torch's, pinned;
  epochs   three epochs of the tensor case with break mid-epoch: pinned memory stays flat;
  race     each batch dropped right after its non_blocking copy was queued behind GPU work:
           every copy holds its own batch (the block is reused once the copy is done);
  stream   an IterableDataset's 12 MiB batches (process workers), in blocks pinned as far as
           their batches use them (the C loader's pin_on_use, stoke_batch_pin): no warning,
           every tensor pinned for CUDA, each batch copied non_blocking behind GPU work and
           dropped at once, the copies equal to torch's batches; the bytes registered stay
           near the batches' (14 MiB a block at most), not the blocks' 256 MiB.

Prints one line per check ("ok NAME detail" or "FAIL NAME why") and exits 1 on any failure.
    PYTHONPATH=build-gpu/python python3 tests/gpu/dropin_cuda.py
    PYTHONPATH=build/python /usr/bin/python3 tests/gpu/dropin_cuda.py --cpu   # dry run here:
        the same comparisons, without the GPU, pinning and the copies
"""
import os
import sys
import warnings

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, TensorDataset

import stoke

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dropin_lib as L  # noqa: E402 - the drop-in tests' comparisons

FAILED = []
CPU = "--cpu" in sys.argv


def pinned(t):
    return CPU or t.is_pinned()


# the pinned allocator's counters that must not grow from one epoch to the next
KEPT = ("bytes_in_use", "bytes_reserved", "registered_bytes", "pin_calls")


def report(name, ok, detail):
    print("%s %s %s" % ("ok" if ok else "FAIL", name, detail), flush=True)
    if not ok:
        FAILED.append(name)


def leaves(x):
    """The batch's tensors (dropin_lib.leaves also keeps lists of strings)."""
    return [t for t in L.leaves(x) if isinstance(t, torch.Tensor)]


def same(a, b):
    """dropin_lib.same's comparison (structure, dtypes, shapes, values) as a bool."""
    try:
        L.same(b, a)
    except AssertionError:
        return False
    return True


def to_gpu_and_back(batch):
    """Every tensor of the batch copied to the GPU asynchronously (from pinned memory: a
    true async copy) and back: equal."""
    ts = leaves(batch)
    if CPU:
        return True
    dev = [t.to("cuda", non_blocking=True) for t in ts]
    torch.cuda.synchronize()
    return all(torch.equal(d.cpu(), t) for d, t in zip(dev, ts))


def compare(name, ours, theirs, detail=""):
    got, want = list(ours), list(theirs)
    if len(got) != len(want):
        report(name, False, "%d batches, torch %d" % (len(got), len(want)))
        return got
    bad = [k for k, (a, b) in enumerate(zip(got, want)) if not same(a, b)]
    unpinned = sum(not pinned(t) for b in got for t in leaves(b))
    copies = all(to_gpu_and_back(b) for b in got[:4])
    report(name, not bad and not unpinned and copies,
           "%d batches equal to torch's%s; unpinned tensors %d; GPU round trip %s%s" % (
               len(got), " except %s" % bad[:5] if bad else "", unpinned,
               "equal" if copies else "DIFFERS", detail))
    return got


class Rows(Dataset):
    """A dict per sample from Python code: the workers must run it."""

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return {"x": torch.arange(12, dtype=torch.float32) * i,
                "meta": {"id": i, "tag": "s%d" % i},
                "y": torch.tensor([i % 7], dtype=torch.int64)}


class Tokens(Dataset):
    def __len__(self):
        return 600

    def __getitem__(self, i):
        n = 5 + (i * 37) % 60
        return {"input_ids": torch.arange(1, n + 1, dtype=torch.int64) + i}


def pad_collate(samples):
    ids = [s["input_ids"] for s in samples]
    return {"input_ids": pad_sequence(ids, batch_first=True),
            "lengths": torch.tensor([len(t) for t in ids])}


def main():
    # A real training process: CUDA initialized and torch's thread pool started before the
    # loader forks its workers (they must never touch the accelerator).
    if not CPU and not torch.cuda.is_available():
        report("cuda", False, "torch sees no GPU")
        return 1
    warm = torch.ones(1 << 20, device="cpu" if CPU else "cuda") * 2
    torch.mm(torch.rand(512, 512), torch.rand(512, 512))
    acc = stoke.accelerator() or {}
    report("setup", CPU or acc.get("backend") == "cuda",
           "stoke accelerator %r, torch %s, %s, %d intra-op threads" % (
               acc.get("backend"), torch.__version__, "no GPU (--cpu)" if CPU else torch.cuda.get_device_name(0),
               torch.get_num_threads()))
    del warm

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.rand(3000, 3, 32, 32, generator=g), torch.arange(3000))
    compare("tensor", stoke.DataLoader(ds, batch_size=256, num_workers=2),
            TorchLoader(ds, batch_size=256, num_workers=2, pin_memory=True))

    compare("dict", stoke.DataLoader(Rows(), batch_size=64, num_workers=2),
            TorchLoader(Rows(), batch_size=64, num_workers=2, pin_memory=True))

    got = list(stoke.DataLoader(Tokens(), batch_size=32, num_workers=2, pad={"input_ids": 0}))
    want = list(TorchLoader(Tokens(), batch_size=32, num_workers=0, collate_fn=pad_collate))
    fields = sorted(got[0].keys()) if got else []
    ok = len(got) == len(want) and all(
        torch.equal(a["input_ids"], b["input_ids"])
        and torch.equal(a["input_ids_lengths"].to(torch.int64), b["lengths"])
        for a, b in zip(got, want))
    unpinned = sum(not pinned(t) for b in got for t in leaves(b))
    report("pad", ok and not unpinned and all(to_gpu_and_back(b) for b in got[:4]),
           "%d batches, fields %s, padded ids and lengths %s torch's pad_sequence; unpinned %d" % (
               len(got), fields, "equal to" if ok else "DIFFER from", unpinned))

    compare("collate", stoke.DataLoader(Tokens(), batch_size=32, num_workers=2,
                                        collate_fn=pad_collate),
            TorchLoader(Tokens(), batch_size=32, num_workers=2, collate_fn=pad_collate,
                        pin_memory=True))

    loader = stoke.DataLoader(ds, batch_size=256, num_workers=2, shuffle=True)
    stats = []
    for epoch in range(3):
        for k, b in enumerate(loader):
            if not CPU:
                b[0].to("cuda", non_blocking=True)
            if epoch == 1 and k == 3:
                break
        if not CPU:
            torch.cuda.synchronize()
        st = stoke.pinned_stats()
        stats.append(tuple(st[k] for k in KEPT))
    report("epochs", len(set(stats[1:])) == 1,
           "pinned %s after each epoch: %s" % (KEPT, stats))
    del loader

    # race: each batch dropped right after its non_blocking copy was queued behind ~1-2 s of
    # GPU work (`x = x.to("cuda", non_blocking=True)`): its block is reused only once the copy
    # is done (python/fence.c), so every copy holds its own batch, at 0 and 2 workers
    bad = {}
    for what, make in (
            ("0 workers", lambda: stoke.DataLoader(Wide(), batch_size=4, num_workers=0)),
            ("2 workers", lambda: stoke.DataLoader(Wide(), batch_size=4, num_workers=2))):
        loader = make()
        if not CPU:
            torch.cuda.synchronize()
            torch.cuda._sleep(3_000_000_000)  # (the stream busy: the copies queue up)
        outs = [b.to("cuda", non_blocking=True) if not CPU else b.clone() for b in loader]
        if not CPU:
            torch.cuda.synchronize()
        bad[what] = [k for k, o in enumerate(outs)
                     if not torch.equal(o[:, 0].cpu(), torch.arange(4 * k, 4 * k + 4).float())]
        del loader
    report("race", all(not v for v in bad.values()),
           "batches whose copy read another batch's bytes: %s" % bad)

    want = list(TorchLoader(Images(), batch_size=64, num_workers=2))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = stoke.DataLoader(Images(), batch_size=64, num_workers=2)
        if not CPU:
            torch.cuda.synchronize()
            torch.cuda._sleep(1_000_000_000)  # (the copies queue behind it)
        outs, unpinned, reg = [], 0, 0
        for x, y in loader:
            unpinned += (not pinned(x)) + (not pinned(y))
            outs.append((x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True))
                        if not CPU else (x.clone(), y.clone()))
            reg = max(reg, stoke.pinned_stats()["registered_bytes"])
        del x, y
        if not CPU:
            torch.cuda.synchronize()
        said = [str(m.message) for m in w if "stoke" in str(m.message)]
        del loader
    bad = [k for k, (a, b) in enumerate(zip(outs, want))
           if not (torch.equal(a[0].cpu(), b[0]) and torch.equal(a[1].cpu(), b[1]))]
    ok = len(outs) == len(want) and not bad and not unpinned and not said and (
        CPU or 0 < reg <= 8 * (14 << 20))
    report("stream", ok, "%d batches of 12 MiB (torch %d), differing %s, unpinned tensors %d, "
           "warnings %s, registered bytes at most %d" % (len(outs), len(want), bad[:5], unpinned,
                                                         said, reg))
    return 1 if FAILED else 0


class Images(torch.utils.data.IterableDataset):
    """640 samples of a 3x128x128 float32 image (192 KiB) and its number, each worker its
    share (get_worker_info): a batch of 64 is 12 MiB, over the 8 MiB blocks of before."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, 640, n):
            yield torch.full((3, 128, 128), float(i)) + torch.arange(128.0), i


class Wide(Dataset):
    """64 samples of 1 MiB, sample i all i."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((1 << 18,), float(i))


if __name__ == "__main__":
    sys.exit(main())
