"""Errors and warnings: the no-accelerator warning is one Python UserWarning, only when
pin_memory=True was asked for (stoke's default, like torch's, does not warn); a source's bad
sample is a stoke.LoaderError naming the sample and the file.  A Python dataset's failure
reaches the caller as torch's DataLoader raises it -- an exception raised by __getitem__ with
its own type and message, default_collate's RuntimeError for samples of different shapes --
after the batches before it, with the worker's traceback in a note naming the batch and the
sample, whether processes, threads or the caller's thread ran __getitem__."""
import os
import re
import warnings

import stoke_testlib as T

T.no_forked_python_under_tsan()

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402

# 1. the warning (no accelerator here: STOKE_ACCELERATOR and STOKE_PLUGIN_PATH empty): none by
#    default (the user never asked for pinning), once with pin_memory=True
if stoke.accelerator() is not None:
    T.skip("an accelerator is present: no pin_memory warning to check")
with warnings.catch_warnings():
    warnings.simplefilter("error")
    for _ in stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0):
        pass
    for _ in stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=2):
        pass
    stoke.DataLoader("synthetic:10,shape=4", pin_memory=False, num_workers=0)

    class Ten:  # a Python dataset whose batches the caller all holds (list(loader)): each is
        def __len__(self):  # copied out, into ordinary memory with no word from the pinned pool
            return 20  # (it warned that pinning was not in effect)

        def __getitem__(self, i):
            return torch.tensor([i])
    for kw in ({}, {"pin_memory": False}):
        held = list(stoke.DataLoader(Ten(), batch_size=2, **kw))
        T.check([int(b[0]) for b in held] == list(range(0, 20, 2)), "held: %s" % held)
    _stoke = stoke._stoke
    _stoke.flush_warnings()  # anything logged in worker threads
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0, pin_memory=True)
    b = stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0, pin_memory=True)
    for _ in a:
        pass
    for _ in b:
        pass
msgs = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
pin = [m for m in msgs if "pin_memory is set but no accelerator" in m]
T.check(len(pin) == 1, "pin_memory warnings: %s" % msgs)
# ... and it names this file's line (the DataLoader(...) above), not stoke's own
where = [(x.filename, x.lineno) for x in w if "pin_memory is set" in str(x.message)]
T.check(where and os.path.samefile(where[0][0], __file__), "the warning points at %s" % where)
T.check(a.pinned_backend is None, "pinned for %r without an accelerator" % a.pinned_backend)


# 2. a .npy that shrank under the loader: the sample past the end, the file named
data, labels, dp, lp = T.make_npy(np, n=64)
loader = stoke.DataLoader("npy:%s,io=pread" % dp, batch_size=8, num_workers=0, pin_memory=False)
os.truncate(dp, os.path.getsize(dp) - 20 * 768 * 4)
try:
    for _ in loader:
        pass
    T.check(False, "a truncated file raised nothing")
except stoke.LoaderError as e:
    T.check(e.sample == 0 and "changed while loading" in str(e), "sample %r: %s" % (e.sample, e))
    T.check(dp in str(e), "message does not name the file: %s" % e)


# 3. __getitem__ raising: the caller gets the dataset's exception -- its own type and message
#    (torch's workers rewrite the message: "Caught ValueError in DataLoader worker process 1
#    ..."; stoke keeps it and attaches the worker's traceback as a note naming the batch and
#    the sample) -- after every batch before the failing one, as torch delivers them
class CorruptRow(Exception):
    pass


class TwoArgs(Exception):
    """An exception whose constructor does not take its own args back (pickle cannot rebuild
    it from them): as torch's, a RuntimeError with its message may stand for it."""

    def __init__(self, row, why):
        super().__init__("row %d: %s" % (row, why))


class Failing:
    def __init__(self, bad, make):
        self.bad, self.make = bad, make

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == self.bad:
            raise self.make(i)
        return np.full(3, i, dtype=np.int32)


MODES = ({"num_workers": 2}, {"num_workers": 2, "worker_mode": "threads"}, {"num_workers": 0})
BUGS = []  # checks of behaviour the loader does not have yet: all reported at the end


def run(ds, **kw):
    """Constructs and iterates a stoke loader over ds: (batches before the error, exception,
    where it was raised)."""
    got, where = [], "construction"
    try:
        loader = stoke.DataLoader(ds, batch_size=4, pin_memory=False, **kw)
        where = "iteration"
        for b in loader:
            got.append(b.clone())
    except Exception as e:  # noqa: BLE001 - checked by the caller
        return got, e, where
    return got, None, where


def torch_run(ds, **kw):
    got = []
    try:
        for b in torch.utils.data.DataLoader(ds, batch_size=4, **kw):
            got.append(b.clone())
    except Exception as e:  # noqa: BLE001
        return got, e
    return got, None


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


for make, want_type, message in (
        (lambda i: ValueError("row %d is corrupt" % i), ValueError, "row 21 is corrupt"),
        (lambda i: CorruptRow("row %d is corrupt" % i), CorruptRow, "row 21 is corrupt"),
        (lambda i: KeyError("row %d" % i), KeyError, "'row 21'")):
    ref, ref_e = torch_run(Failing(21, make), num_workers=0)
    T.check(type(ref_e) is want_type and len(ref) == 5, "torch: %r after %d" % (ref_e, len(ref)))
    for kw in MODES:
        what = "%s, %s" % (want_type.__name__, kw)
        got, e, where = run(Failing(21, make), **kw)
        T.check(type(e) is want_type and str(e) == message,
                "%s: %s %s: %s" % (what, where, type(e).__name__, e))
        T.check(len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref)),
                "%s: %d batches before the error, torch %d" % (what, len(got), len(ref)))
        text = notes(e)
        T.check("batch 5" in text and "dataset index 21" in text,
                "%s: the note does not name batch 5, dataset index 21: %s" % (what, text))
        T.check("in __getitem__" in text and "raise self.make(i)" in text
                and text.rstrip().endswith(message if want_type is not KeyError else
                                           "KeyError: " + message),
                "%s: the note lacks the worker's traceback: %s" % (what, text))
        T.check(("in stoke worker" in text) == (kw.get("worker_mode") is None
                                                and kw["num_workers"] > 0),
                "%s: the note names the wrong place: %s" % (what, text[:80]))
        # the loader's error behind it names the dataset index (it was the batch's number)
        cause = e.__cause__
        T.check(isinstance(cause, stoke.LoaderError) and cause.sample == 21
                and ": batch 5 of " in str(cause),
                "%s: the cause: %r, %s" % (what, getattr(cause, "sample", cause), cause))

# a sample in the first batch, which stoke makes once at construction (in a forked child) to
# measure the batch block: the same exception; it must still name the sample
for kw in MODES:
    got, e, where = run(Failing(2, lambda i: ValueError("row %d is corrupt" % i)), **kw)
    T.check(type(e) is ValueError and str(e) == "row 2 is corrupt",
            "bad sample 2, %s: %s %s: %s" % (kw, where, type(e).__name__, e))
    if "dataset index 2" not in notes(e):
        BUGS.append("bad sample 2 (batch 0), %s: raised at %s, the note does not name dataset "
                    "index 2: %r" % (kw, where, notes(e)[:120]))

# an exception pickle cannot rebuild: TwoArgs itself (no process boundary with threads or 0
# workers) or a RuntimeError carrying its text, as torch's workers raise; the sample named
for kw in MODES:
    got, e, where = run(Failing(21, lambda i: TwoArgs(i, "corrupt")), **kw)
    if not (isinstance(e, (TwoArgs, RuntimeError)) and "row 21: corrupt" in str(e)
            and "dataset index 21" in notes(e)):
        BUGS.append("TwoArgs, %s: %s %s: %r, notes %r"
                    % (kw, where, type(e).__name__, str(e)[:120], notes(e)[:80]))


# 4. samples of different shapes: torch's default_collate error (its type and message), after
#    the batches before it; the note names the batch, and no sample but the odd one
class Ragged:
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return np.zeros(5 if i == 21 else 4, dtype=np.float32)


ref, ref_e = torch_run(Ragged(), num_workers=0)
T.check(type(ref_e) is RuntimeError and len(ref) == 5, "torch: %r" % ref_e)
for kw in MODES:
    got, e, where = run(Ragged(), **kw)
    T.check(type(e) is RuntimeError and str(e) == str(ref_e),
            "ragged, %s: %s %s: %s (torch: %s)" % (kw, where, type(e).__name__, e, ref_e))
    T.check(len(got) == 5 and all(torch.equal(a, b) for a, b in zip(got, ref)),
            "ragged, %s: %d batches before the error" % (kw, len(got)))
    T.check("batch 5" in notes(e), "ragged, %s: notes %s" % (kw, notes(e)))
    named = re.findall(r"dataset index (\d+)", notes(e))
    if named not in ([], ["21"]):
        BUGS.append("ragged (sample 21 has 5 elements), %s: the note blames dataset index %s "
                    "for default_collate's error" % (kw, ", ".join(named)))

T.check(not BUGS, "%d failing check(s):\n  %s" % (len(BUGS), "\n  ".join(BUGS)))
_ = e = None  # no batch (and so no loader) left alive at exit
print("ok")
