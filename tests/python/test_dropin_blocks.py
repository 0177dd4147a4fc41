"""The drop-in's block sizing and source strings as torch's structure: a batch larger than its
block (max_batch_bytes too small) is made again in the caller's process with one
RuntimeWarning naming the size to pass, and equals torch's batch; structure="list"/"dict" give
a source string's fields as tensors viewing the batch."""
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402


class Ragged:
    """int64 rows of 1..200 values, padded by a collate_fn: batch sizes vary 1..40 x."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.arange(1 + (i * 37) % 200, dtype=torch.int64) + i


def pad(batch):
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=-1)


ref = [b.clone() for b in torch.utils.data.DataLoader(Ragged(), batch_size=8, collate_fn=pad)]
for workers in (0, 2):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [b.clone() for b in stoke.DataLoader(Ragged(), batch_size=8, num_workers=workers,
                                                   collate_fn=pad, max_batch_bytes=4096)]
    T.check(len(got) == len(ref), "workers=%d: %d batches, torch %d" % (workers, len(got),
                                                                     len(ref)))
    for k, (g, r) in enumerate(zip(got, ref)):
        T.check(torch.equal(g, r), "workers=%d: batch %d differs from torch's" % (workers, k))
    over = [str(x.message) for x in w if "more than a block" in str(x.message)]
    T.check(len(over) == 1 and "max_batch_bytes=" in over[0],
            "workers=%d: the oversize warning, once: %s" % (workers, over))

data, labels, dp, lp = T.make_npy(np, n=40, row_floats=12)
for structure in ("list", "dict"):
    loader = stoke.DataLoader("npy:%s,labels=%s" % (dp, lp), batch_size=8, num_workers=0,
                              structure=structure)
    seen = 0
    for b in loader:
        x, y = (b["data"], b["label"]) if structure == "dict" else b
        T.check(isinstance(x, torch.Tensor) and x.shape[1:] == (12,), "%s: %r" % (structure, x))
        T.check(np.array_equal(x.numpy(), data[seen:seen + len(y)])
                and np.array_equal(y.numpy(), labels[seen:seen + len(y)]),
                "%s: rows differ from the .npy at %d" % (structure, seen))
        seen += len(y)
    T.check(seen == 40, "%s: %d samples" % (structure, seen))
try:
    stoke.DataLoader("npy:%s" % dp, structure="tuple")
    T.check(False, "structure='tuple' accepted")
except ValueError as e:
    T.check("structure must be" in str(e), str(e))


class SlowInChild:
    """Sample i = tensor([i]); in any process but this one __getitem__ never returns (a child
    forked while another thread held a lock it needs would hang the same way)."""
    main = None

    def __len__(self):
        return 10

    def __getitem__(self, i):
        import os
        import time
        while os.getpid() != SlowInChild.main:
            time.sleep(1)
        return torch.tensor([i])


import os  # noqa: E402
import time  # noqa: E402
from stoke import _dropin  # noqa: E402

SlowInChild.main = os.getpid()
_dropin._PROBE_TIMEOUT_S = 1
# with workers the first batch is measured in a forked child (one worker thread here, so that
# the batches themselves are made in this process); with none, here: no child to hang
for kw, probed in (({"num_workers": 1, "worker_mode": "threads"}, True),
                   ({"num_workers": 0}, False)):
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = stoke.DataLoader(SlowInChild(), batch_size=4, **kw)
    slow = [str(x.message) for x in w if "measuring the first batch" in str(x.message)]
    T.check(len(slow) == int(probed) and all("max_batch_bytes" in m for m in slow),
            "%s: a hung probe: warnings %s" % (kw, slow))
    T.check(time.monotonic() - t0 < 30,
            "%s: the constructor took %.1f s" % (kw, time.monotonic() - t0))
    got = [b.view(-1).tolist() for b in loader]
    T.check(got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], "%s: after the probe: %s" % (kw, got))
    del loader
print("ok")
