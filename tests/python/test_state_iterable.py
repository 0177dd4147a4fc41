"""state_dict()/load_state_dict() with a torch IterableDataset (the drop-in): with num_workers 0,
or 1 worker thread, the loader's ITERABLE resume replays the dataset's iterator (the delivered
batches made again and dropped): the batches before and after the cut are an uninterrupted
epoch's, for every cut; worker processes (not checked under TSan) and threads sharing one
iterator refuse state_dict and load_state_dict.  Skips (77) without torch."""
import os
import warnings

import stoke_testlib as T

torch = T.need("torch")
import stoke  # noqa: E402

N = 37


class Counting(torch.utils.data.IterableDataset):
    """Sample i: 4 int64s of value i * 7 + epoch (set_epoch: torch's convention)."""

    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i in range(N):
            yield torch.full((4,), i * 7 + self.epoch, dtype=torch.int64)


def make(**kw):
    return stoke.DataLoader(Counting(), batch_size=3, pin_memory=False, **kw)


for kw in ({"num_workers": 0}, {"num_workers": 1, "worker_mode": "threads"}):
    full = [b.tolist() for b in make(**kw)]
    T.check(len(full) == 13 and sum(len(b) for b in full) == N, "%s: %s" % (kw, full))
    for k in range(len(full) + 1):
        a = make(**kw)
        it = iter(a)
        head = [next(it).tolist() for _ in range(k)]
        state = a.state_dict()
        T.check(state["workers"] == kw["num_workers"] + 1, "%s: state %s" % (kw, state))
        del it, a
        b = make(**kw)
        b.load_state_dict(state)
        got = head + [x.tolist() for x in b]
        T.check(got == full, "%s: resumed after %d: %s" % (kw, k, got))
        # the state of a 0-worker loader refused by a 1-thread one (the split may differ)
        if k == 1 and kw["num_workers"] == 0:
            try:
                make(num_workers=1, worker_mode="threads").load_state_dict(state)
                T.check(False, "a 0-worker state restored with 1 worker")
            except stoke.StokeError as e:
                T.check("with 0 workers" in str(e), "other workers: %s" % e)

# refused by configuration, at any position (worker processes: not under TSan, whose forked
# interpreter cannot run them, STOKE_PY_TSAN)
procs = [] if os.environ.get("STOKE_PY_TSAN") else [{"num_workers": 1}, {"num_workers": 2}]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # ThreadsWarning
    for kw in procs + [{"num_workers": 2, "worker_mode": "threads"}]:
        a = make(**kw)
        try:
            a.state_dict()
            T.check(False, "%s: state_dict did not refuse" % kw)
        except stoke.StokeError as e:
            T.check("cannot be replayed" in str(e), "%s: %s" % (kw, e))
        # nor restored: the cursor was taken and ignored (the whole epoch again; at 2^48 none,
        # with a warning that the epoch was cut)
        try:
            a.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "batches_yielded": 5,
                               "workers": kw["num_workers"] + 1})
            T.check(False, "%s: load_state_dict did not refuse" % kw)
        except stoke.StokeError as e:
            T.check("load_state_dict of an IterableDataset" in str(e), "%s: %s" % (kw, e))
        del a
print("ok")
