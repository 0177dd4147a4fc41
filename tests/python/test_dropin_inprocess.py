"""stoke.DataLoader over a map-style Python dataset with num_workers=0 makes everything in this
process (issue 27's finding: a child forked per loader to measure the first batch, and a pickle
per batch, made it 0.3x torch on small batches): every __getitem__ call runs in this process
(calls are logged to an O_APPEND file, so that a forked child's would show), one call per
sample an epoch, as torch's DataLoader makes (batch 0 is made at construction and delivered,
not made again), no batch structure pickled; the batches, and the global RNGs (torch, random,
NumPy) after each epoch, equal torch's for a dataset drawing from all three, with the seeds
set before the loader is made and after it (batch 0 is then made again, from the new seeds,
its first making's draws undone); a failure in batch 0 is raised by the iteration, not the
constructor, and its sample is fetched once."""
import os
import random

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import stoke  # noqa: E402
from stoke import _dropin  # noqa: E402

ME = os.getpid()
LOG = os.path.join(T.tmpdir(), "inprocess-calls-%d.log" % ME)


class Logged:
    """Dict samples drawing from torch's, Python's and NumPy's global RNGs; each call appends
    "pid index" to LOG."""

    def __init__(self, n=64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"%d %d\n" % (os.getpid(), i))
        os.close(fd)
        return {"x": torch.full((3,), float(i)) + torch.rand(3), "r": random.random(),
                "n": np.float64(np.random.rand()), "name": "s%d" % i, "i": i}


def calls():
    """[(pid, index)] logged since the last call; the log starts again."""
    try:
        with open(LOG) as f:
            out = [tuple(int(v) for v in line.split()) for line in f]
    except FileNotFoundError:
        out = []
    if os.path.exists(LOG):
        os.unlink(LOG)
    return out


def states():
    return (torch.get_rng_state(), random.getstate(), np.random.get_state())


def same_states(a, b):
    return (torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0]
            and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:])


def seed_all(s):
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def run(make, ds, when, epochs=2, **kw):
    """Batches of `epochs` epochs (cloned), the RNG states after each, the logged calls."""
    seed_all(5 if when == "before" else 3)
    loader = make(ds, pin_memory=False, **kw)
    if when == "after":
        seed_all(5)
    elif when == "after-random":  # only Python's RNG: torch's stays where construction left it
        random.seed(5)
    out, rng = [], []
    for _ in range(epochs):
        out.append([{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                    for b in loader])
        rng.append(states())
    del loader
    return out, rng, calls()


def same_batches(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], torch.Tensor):
                if not (isinstance(y[k], torch.Tensor) and x[k].dtype == y[k].dtype
                        and torch.equal(x[k], y[k])):
                    return False
            elif x[k] != y[k]:
                return False
    return True


# no batch structure is pickled (counted on the pickler's class)
pickled = []


class CountingPickler(_dropin._BlockPickler):
    def dump(self, obj):
        pickled.append(1)
        return super().dump(obj)


_dropin._BlockPickler = CountingPickler

calls()
bad = []
for when in ("before", "after", "after-random"):
    for kw in ({"batch_size": 8}, {"batch_size": 5, "shuffle": False, "drop_last": True},
               {"batch_size": 8, "collate_fn": lambda s: {"x": torch.stack([d["x"] for d in s]),
                                                          "i": [d["i"] for d in s]}}):
        what = "%s, %s" % (when, {k: v for k, v in kw.items() if k != "collate_fn"})
        if "collate_fn" in kw:
            what += " + collate_fn"
        ref, ref_rng, ref_calls = run(TorchLoader, Logged(), when, **kw)
        del pickled[:]
        got, got_rng, got_calls = run(stoke.DataLoader, Logged(), when, num_workers=0, **kw)
        for e in range(2):
            if not same_batches(got[e], ref[e]):
                bad.append("%s: epoch %d's batches differ from torch's" % (what, e))
            if not same_states(got_rng[e], ref_rng[e]):
                bad.append("%s: the RNGs after epoch %d differ from torch's" % (what, e))
        pids = {p for p, _ in got_calls}
        T.check(pids == {ME}, "%s: __getitem__ ran in pids %s (this one %d)" % (what, pids, ME))
        redo = when != "before"  # batch 0 made again from the new seeds
        want = sorted(i for _, i in ref_calls) + (
            sorted(i for _, i in ref_calls[:kw["batch_size"]]) if redo else [])
        T.check(sorted(i for _, i in got_calls) == sorted(want),
                "%s: __getitem__ calls %s, torch's %s" % (what, got_calls[:12], ref_calls[:12]))
        T.check(not pickled, "%s: %d batch structures pickled" % (what, len(pickled)))
T.check(not bad, "\n  ".join(["differences from torch:"] + bad))


class FailsAt:
    """Sample 2 raises a KeyError; each call logged."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        Logged.__getitem__(Logged(), i)
        if i == 2:
            raise KeyError("sample two")
        return torch.tensor([i])


calls()
loader = stoke.DataLoader(FailsAt(), batch_size=4, num_workers=0, pin_memory=False)
try:
    next(iter(loader))
    T.check(False, "batch 0 with a failing sample was delivered")
except KeyError as e:
    T.check("sample two" in str(e) and "dataset index 2" in "".join(getattr(e, "__notes__", [])
                                                                     + [str(e)]),
            "the error: %r %s" % (e, getattr(e, "__notes__", "")))
got = calls()
T.check(got == [(ME, 0), (ME, 1), (ME, 2)], "calls up to the failure: %s" % got)
del loader
print("ok")
