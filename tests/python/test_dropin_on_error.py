"""on_error for a Python dataset: its unit is the batch (the C loader's sample).  skip drops a
batch in which __getitem__ raised or whose worker process died, replace loads another batch of
the epoch in its place (deterministic), each with one RuntimeWarning naming the batch, the
dataset index and the exception or the signal; a budget ("skip:1") ends the epoch with the
dataset's exception past it; a bad spec is a ValueError.  stats() counts, quarantine() lists."""
import os
import signal
import time
import warnings

import stoke_testlib as T

torch = T.need("torch")
import stoke  # noqa: E402

MAIN = os.getpid()


class DS:
    """40 samples, sample i = tensor([i]); `bad` raise ValueError, `crash` SIGKILL their worker
    process (never the test's own)."""

    def __init__(self, bad=(), crash=()):
        self.bad, self.crash = bad, crash

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError("bad sample %d" % i)
        if i in self.crash and os.getpid() != MAIN:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


def run(ds, **kw):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        loader = stoke.DataLoader(ds, batch_size=4, **kw)
        got = [b.view(-1).tolist() for b in loader]
    mine = [str(w.message) for w in ws if "on_error=" in str(w.message)]
    return loader, got, mine


want = [list(range(k, k + 4)) for k in range(0, 40, 4)]
tsan = bool(os.environ.get("STOKE_PY_TSAN"))
for workers in (0,) if tsan else (0, 2):
    what = "workers=%d" % workers
    loader, got, ws = run(DS(bad=(13,)), num_workers=workers, on_error="skip")
    T.check(got == want[:3] + want[4:], "%s skip: %s" % (what, got))
    T.check(len(ws) == 1 and "batch 3 of epoch 0 skipped" in ws[0] and "ValueError: bad sample 13"
            in ws[0] and "dataset index 13" in ws[0], "%s skip: warnings %s" % (what, ws))
    st = loader.stats()
    T.check(st["bad_samples"] == 1 and st["skipped_samples"] == 1, "%s skip: stats %s" % (what, st))
    q = loader.quarantine()
    T.check(len(q) == 1 and q[0]["index"] == 3 and q[0]["action"] == "skip"
            and q[0]["replacement"] is None, "%s skip: quarantine %s" % (what, q))

    loader, got, ws = run(DS(bad=(13,)), num_workers=workers, on_error="replace")
    q = loader.quarantine()
    T.check(len(q) == 1 and q[0]["action"] == "replace" and q[0]["replacement"] is not None
            and q[0]["replacement"] != 3, "%s replace: quarantine %s" % (what, q))
    r = q[0]["replacement"]
    T.check(got == want[:3] + [want[r]] + want[4:], "%s replace: %s (by batch %d)" % (what, got, r))
    T.check(len(ws) == 1 and "replaced by batch %d" % r in ws[0], "%s replace: %s" % (what, ws))

    try:
        run(DS(bad=(5, 13)), num_workers=workers, on_error="skip:1")
        T.check(False, "%s skip:1 let two bad batches pass" % what)
    except ValueError as e:
        T.check(str(e) == "bad sample 13", "%s skip:1: %r" % (what, e))

if not tsan:
    loader, got, ws = run(DS(crash=(13,)), num_workers=2, on_error="skip")
    T.check(got == want[:3] + want[4:], "crash skip: %s" % got)
    T.check(len(ws) == 1 and "batch 3 of epoch 0 skipped" in ws[0] and "SIGKILL" in ws[0],
            "crash skip: warnings %s" % ws)
    T.check(loader.stats()["worker_restarts"] >= 1, "crash: %s" % loader.stats())



class Stops(DS):
    """Sample 13 raises `exc` (a BaseException that is not an Exception), or with "sigint"
    sends SIGINT to the test's process and waits for its handler: Ctrl-C in __getitem__."""

    def __init__(self, exc):
        super().__init__()
        self.exc = exc

    def __getitem__(self, i):
        if i == 13:
            if self.exc == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):  # (the handler raises KeyboardInterrupt in here)
                    time.sleep(0.01)
            else:
                raise self.exc
        return super().__getitem__(i)


# KeyboardInterrupt (Ctrl-C) and SystemExit (sys.exit()) in __getitem__ are never a bad batch:
# made in this process they reach the caller as themselves, as torch's; in a worker process they
# end the epoch with the loader's error (torch: its worker exited, a RuntimeError)
cases = [(0, "sigint"), (0, KeyboardInterrupt()), (0, SystemExit(3)),
         (2, SystemExit(3), "threads")]
if not tsan:
    cases += [(2, KeyboardInterrupt(), "processes"), (2, SystemExit(3), "processes")]
for workers, exc, *mode in cases:
    for policy in (None, "skip", "replace"):
        what = "%s workers=%d %s on_error=%s" % (exc if exc == "sigint" else type(exc).__name__,
                                                 workers, mode, policy)
        kw = {"worker_mode": mode[0]} if mode else {}
        want = KeyboardInterrupt if exc == "sigint" else type(exc)
        if mode == ["processes"]:
            want = stoke.LoaderError
        got = []
        try:
            loader, got, ws = run(Stops(exc), num_workers=workers, on_error=policy, **kw)
            raised = None
        except BaseException as e:  # noqa: BLE001
            raised = e
        T.check(type(raised) is want, "%s: raised %r, want %s (batches %s)" % (
            what, raised, want.__name__, got))
        if want is stoke.LoaderError:
            T.check(type(exc).__name__ in str(raised) and "dataset index 13" in str(raised)
                    and raised.code_name == "STOKE_ECANCELED", "%s: %s" % (what, raised))
        elif exc != "sigint":
            T.check(raised is exc, "%s: not the exception raised" % what)

try:
    stoke.DataLoader(DS(), batch_size=4, on_error="ignore")
    T.check(False, "on_error='ignore' accepted")
except ValueError as e:
    T.check("on_error" in str(e), str(e))
print("ok")
