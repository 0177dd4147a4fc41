"""A map dataset's __getitem__ that raises StopIteration (a dataset over a stream shorter than
its __len__) ends the loop quietly, as torch's DataLoader's iterator does with 0 and 2 workers
(stoke's generator turned it into "RuntimeError: generator raised StopIteration", PEP 479),
and a next() after it goes on with the next batch, as torch's."""
import os

import stoke_testlib as T

torch = T.need("torch")
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402

import stoke  # noqa: E402

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)
WORKERS = (0, 2) if PROCS else (0,)


class Short(torch.utils.data.Dataset):
    """8 samples said, 5 there: sample i >= 5 raises StopIteration."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i >= 5:
            raise StopIteration
        return i


@case
def loop_ends_quietly():
    for workers in WORKERS:
        ref = [b.tolist() for b in L.TorchLoader(Short(), batch_size=2, num_workers=workers)]
        got = [b.tolist() for b in stoke.DataLoader(Short(), batch_size=2, num_workers=workers)]
        T.check(ref == [[0, 1], [2, 3]], "torch, workers=%d: %r" % (workers, ref))
        T.check(got == ref, "workers=%d: %r" % (workers, got))


@case
def next_goes_on():
    # batch 2 ([4, 5]) raises; batch 3 ([6, 7]) too; then the epoch's end
    for workers in WORKERS:
        for make in (L.TorchLoader, stoke.DataLoader):
            it = iter(make(Short(), batch_size=2, num_workers=workers))
            seen = [next(it).tolist(), next(it).tolist()]
            for _ in range(3):
                try:
                    seen.append(next(it).tolist())
                except StopIteration:
                    seen.append("stop")
            T.check(seen == [[0, 1], [2, 3], "stop", "stop", "stop"],
                    "%s, workers=%d: %r" % (make.__module__, workers, seen))


L.run_cases()
