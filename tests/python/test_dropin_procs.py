"""stoke.DataLoader's process workers for Python datasets (issue 27): a parent whose torch thread
pool was started first, __getitem__ and collate_fn raising (the type, the traceback and the
index reach the caller), a child killed by SIGKILL or SIGSEGV mid-epoch (the message names the
pid and the signal; no hang, no child left), SIGINT during iteration (sent to this process,
and Ctrl-C as a terminal sends it, to the whole process group), breaking out mid-epoch then
iterating again, `del loader` while its tensors are held, interpreter exit with live loaders.

Every case ends with no child process of this one left (this process is a child subreaper, so
orphaned grandchildren of the subprocesses are seen too); a hung case dumps the stacks and
fails (dropin_lib's watchdog)."""
import ctypes
import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

import stoke_testlib as T

import dropin_lib as L  # noqa: E402
from dropin_lib import case, check_sequential, epoch, no_children_within  # noqa: E402

torch = L.torch
from torch.utils.data import Dataset  # noqa: E402

PARENT = os.getpid()
# orphans of the subprocesses (exited parents' workers) are re-parented to this process
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
signal.signal(signal.SIGINT, signal.default_int_handler)

# the parent's torch thread pool runs before any loader exists (first case)
torch.set_num_threads(2)
_a = torch.randn(256, 256)
T.check(float((_a @ _a).sum()) == float((_a @ _a).sum()), "matmul")
_ = (torch.arange(400_000) % 7).sum()


def in_child():
    return os.getpid() != PARENT


def rows(n):
    return [(i, torch.arange(6, dtype=torch.float32) + 10 * i) for i in range(n)]


class Rows(Dataset):
    def __init__(self, n=64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, torch.arange(6, dtype=torch.float32) + 10 * i


def check_rows(batches, n, what):
    """Batches of Rows: every index once, in order, each row its index's."""
    idx = [i for b in batches for i in b[0].tolist()]
    T.check(idx == list(range(n)), "%s: indices %s" % (what, idx[:20]))
    for b in batches:
        want = b[0].to(torch.float32).view(-1, 1) * 10 + torch.arange(6, dtype=torch.float32)
        T.check(torch.equal(b[1], want), "%s: rows differ at %s" % (what, b[0].tolist()))


def fresh_epoch_works(what):
    """After a failure: a new loader with process workers runs a full, correct epoch."""
    loader = L.Loader(Rows(40), batch_size=8, num_workers=2)
    check_rows(epoch(loader), 40, what + ", then a new loader")
    del loader
    gc.collect()


class TorchOps(Dataset):
    """Torch ops inside __getitem__ (a matmul, a large elementwise op and a reduction), exact
    in any thread count."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        m = torch.randint(-8, 8, (96, 96), generator=g).to(torch.float64)
        big = (torch.arange(300_000) * (i + 1)) % 97
        return (m @ m.T).sum(dim=0), big.sum(), torch.get_num_threads()


@case
def torch_pool_started_before():
    ds = TorchOps()
    want = [ds[i] for i in range(len(ds))]
    for workers in (2, 1):
        what = "torch ops in workers=%d after the parent's pool started" % workers
        loader = L.Loader(ds, batch_size=6, num_workers=workers)
        got = epoch(loader)
        T.check(len(got) == 8, "%s: %d batches" % (what, len(got)))
        for k, b in enumerate(got):
            T.check(torch.equal(b[0], torch.stack([w[0] for w in want[6 * k:6 * k + 6]])),
                    "%s: matmul rows of batch %d" % (what, k))
            T.check(torch.equal(b[1], torch.stack([w[1] for w in want[6 * k:6 * k + 6]])),
                    "%s: sums of batch %d" % (what, k))
        del loader
        gc.collect()
        no_children_within(15, what)
    T.check(torch.get_num_threads() == 2, "parent threads %d" % torch.get_num_threads())
    T.check(torch.equal(_a @ _a, _a @ _a), "the parent's matmul after the workers")


# --- exceptions -----------------------------------------------------------------------------

class BadRow(Exception):
    pass


def decode_row_badly(i):
    raise BadRow("row %d is corrupt" % i)


class Raising(Rows):
    def __getitem__(self, i):
        if i == 13:
            decode_row_badly(i)
        return super().__getitem__(i)


def collate_explodes(batch):
    if any(i == 21 for i, _ in batch):
        raise KeyError("no collate for 21")
    return torch.tensor([i for i, _ in batch]), torch.stack([r for _, r in batch])


def full_text(e):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))


@case
def getitem_raises():
    """The same type reaches the caller, with the child's traceback text (the raising
    function named) and the sample index."""
    for workers in (1, 2):
        what = "__getitem__ raising, workers=%d" % workers
        loader = L.Loader(Raising(), batch_size=4, num_workers=workers)
        try:
            epoch(loader)
            T.check(False, "%s: no exception" % what)
        except BadRow as e:
            text = full_text(e)
            T.check("row 13 is corrupt" in str(e), "%s: message %r" % (what, str(e)))
            T.check("decode_row_badly" in text and "__getitem__" in text,
                    "%s: the child's traceback is not attached:\n%s" % (what, text))
            T.check(re.search(r"sample\D{0,20}\b13\b", text),
                    "%s: the sample index is not named:\n%s" % (what, text))
        except Exception as e:
            raise AssertionError("%s: %s instead of BadRow:\n%s" % (what, type(e).__name__,
                                                                     full_text(e)))
        del loader
        gc.collect()
        no_children_within(15, what)


@case
def collate_fn_raises():
    what = "collate_fn raising, workers=2"
    loader = L.Loader(Rows(), batch_size=4, num_workers=2, collate_fn=collate_explodes)
    try:
        epoch(loader)
        T.check(False, "%s: no exception" % what)
    except KeyError as e:
        text = full_text(e)
        T.check("collate_explodes" in text, "%s: no child traceback:\n%s" % (what, text))
    except Exception as e:
        raise AssertionError("%s: %s instead of KeyError:\n%s" % (what, type(e).__name__,
                                                                   full_text(e)))
    del loader
    gc.collect()
    no_children_within(15, what)


# --- children that die ----------------------------------------------------------------------

class Dying(Rows):
    """Sample 37's worker kills itself with `sig` (writing its pid first)."""

    def __init__(self, sig, pidfile):
        super().__init__(64)
        self.sig, self.pidfile = sig, pidfile

    def __getitem__(self, i):
        if i == 37 and in_child():
            with open(self.pidfile, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), self.sig)
            time.sleep(30)
        return super().__getitem__(i)


SIGNAL_WORDS = {signal.SIGKILL: ("SIGKILL", "Killed", "signal 9"),
                signal.SIGSEGV: ("SIGSEGV", "Segmentation fault", "signal 11")}


def killed_child(sig):
    name = signal.Signals(sig).name
    pidfile = os.path.join(T.tmpdir(), "victim.pid")
    what = "a worker killed by %s mid-epoch" % name
    loader = L.Loader(Dying(sig, pidfile), batch_size=4, num_workers=2)
    delivered, b = [], None
    start = time.monotonic()
    try:
        for b in loader:
            delivered.extend(b[0].tolist())
        T.check(False, "%s: the epoch ended without an error (%d samples)" % (
            what, len(delivered)))
    except RuntimeError as e:
        took = time.monotonic() - start
        T.check(os.path.exists(pidfile), "%s: sample 37 never ran in a child" % what)
        with open(pidfile) as f:
            pid = f.read()
        msg = str(e)
        T.check(re.search(r"\b%s\b" % pid, msg), "%s: the message does not name pid %s: %r"
                % (what, pid, msg))
        T.check(any(w in msg for w in SIGNAL_WORDS[sig]), "%s: the message does not name the "
                "signal (%s): %r" % (what, "/".join(SIGNAL_WORDS[sig]), msg))
        T.check(37 not in delivered, "%s: sample 37 delivered" % what)
        print("  %s: %s after %.1f s, %d samples delivered: %s" % (
            what, type(e).__name__, took, len(delivered), msg.splitlines()[0][:200]))
    del loader, b
    gc.collect()
    no_children_within(15, what)
    fresh_epoch_works(what)
    no_children_within(15, what)


@case
def child_sigkill():
    killed_child(signal.SIGKILL)


@case
def child_sigsegv():
    killed_child(signal.SIGSEGV)


# --- SIGINT ---------------------------------------------------------------------------------

class Stalls(Rows):
    """Samples from 40 on never come (a minute each): the caller waits on the loader."""

    def __init__(self):
        super().__init__(400)

    def __getitem__(self, i):
        if i >= 40 and in_child():
            time.sleep(60)
        return super().__getitem__(i)


@case
def sigint_to_this_process():
    """SIGINT sent (from a thread) while the caller waits for a batch: KeyboardInterrupt in
    the loop, promptly, and the children gone after the loader."""
    what = "SIGINT while waiting for a batch"
    loader = L.Loader(Stalls(), batch_size=4, num_workers=2)
    got, sent, b = [], [], None

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    try:
        for k, b in enumerate(loader):
            got.append(b)
            if k == 2:
                threading.Timer(0.5, interrupt).start()
        T.check(False, "%s: the epoch ended" % what)
    except KeyboardInterrupt:
        T.check(sent, "%s: KeyboardInterrupt before the signal" % what)
        took = time.monotonic() - sent[0]
        T.check(took < 20, "%s: KeyboardInterrupt %.1f s after the signal" % (what, took))
    check_rows(got, len(got) * 4, what + " (batches before)")
    del loader, got, b
    gc.collect()
    no_children_within(20, what)


CTRL_C = r"""
import gc, time
import dropin_child as C
loader = C.stalling_loader()
try:
    for k, b in enumerate(loader):
        if k == 2:
            print("READY", flush=True)
    print("ENDED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
del loader, b
gc.collect()
deadline = time.monotonic() + 20
while C.children() and time.monotonic() < deadline:
    time.sleep(0.05)
print("CHILDREN", C.children(), flush=True)
"""


def session_members(sid):
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # state ppid pgrp session
                out.append(int(p))
        except (OSError, IndexError, ValueError):
            pass
    return out


def script(code):
    """Starts code in a fresh interpreter (same environment: PYTHONPATH) in its own session."""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def nothing_left_of(p, seconds, what):
    """Waits up to `seconds` for no process in p's session and no child here (reaping the
    orphans re-parented to this subreaper once they exit); fails naming what is left."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        left = sorted(set(session_members(p.pid)) | set(L.children()))
        if not left:
            return
        if time.monotonic() > deadline:
            for pid in left:  # not to leak them into the next cases
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            raise AssertionError("%s: processes left %.0f s after the script's exit: %s" % (
                what, seconds, left))
        time.sleep(0.05)


@case
def ctrl_c_process_group():
    """Ctrl-C at a terminal: SIGINT to the whole process group (the caller and its workers).
    The caller gets KeyboardInterrupt, the workers print no tracebacks, none is left."""
    what = "SIGINT to the process group"
    p = script(CTRL_C)
    line = p.stdout.readline()
    T.check(line.strip() == "READY", "%s: the script said %r; stderr %s" % (
        what, line, p.stderr.read() if p.poll() is not None else ""))
    os.killpg(p.pid, signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise AssertionError("%s: the script hung after SIGINT" % what)
    T.check(p.returncode == 0, "%s: exit %d, stderr:\n%s" % (what, p.returncode, err[-3000:]))
    T.check("INTERRUPTED" in out, "%s: no KeyboardInterrupt in the loop: %r" % (what, out))
    T.check("CHILDREN []" in out, "%s: children left in the script: %r" % (what, out))
    T.check("Traceback" not in err, "%s: tracebacks on stderr:\n%s" % (what, err[-3000:]))
    nothing_left_of(p, 10, what)


# --- epochs, lifetimes ----------------------------------------------------------------------

@case
def break_then_iterate_again():
    """A break mid-epoch, then a new `for`: a full, correct epoch (torch's: a new iterator is a
    new epoch), twice; sequential, shuffled and with persistent workers."""
    ds = Rows(100)
    ref = epoch(L.TorchLoader(ds, batch_size=8))
    for kw in ({}, {"persistent_workers": True}, {"shuffle": True}):
        what = "break then iterate again %s" % kw
        loader = L.Loader(ds, batch_size=8, num_workers=2, **kw)
        for k, b in enumerate(loader):
            if k == 3:
                break
        del b
        for e in range(2):
            got = epoch(loader)
            if kw.get("shuffle"):
                L.check_multiset(ref, got, "%s epoch %d" % (what, e))
            else:
                check_sequential(ref, got, "%s epoch %d" % (what, e))
                check_rows(got, 100, what)
        del loader
        gc.collect()
        no_children_within(15, what)


@case
def del_loader_holding_tensors():
    """Tensors of batches held past `del loader` (and past the end of its workers, and another
    loader's epoch that reuses memory) keep their values."""
    what = "del loader while holding tensors"
    loader = L.Loader(Rows(200), batch_size=8, num_workers=2)
    held = []
    for k, b in enumerate(loader):
        if k in (0, 5, 9):
            held.append(b)
        if k == 12:
            break
    held.append(next(iter(loader)))
    del loader, b
    gc.collect()
    check_rows(held[:1], 8, what)
    T.check(held[1][0].tolist() == list(range(40, 48)), "%s: %s" % (what, held[1][0].tolist()))
    for b in held:
        check_rows([(b[0] - b[0][0], b[1] - 10 * b[0][0].to(torch.float32))], 8, what)
    snap = [L.snapshot(b) for b in held]
    other = L.Loader(Rows(300), batch_size=8, num_workers=2)
    check_rows(epoch(other), 300, what + ", the next loader")
    del other
    gc.collect()
    for a, b in zip(snap, held):
        L.same(a, b, what + ": after another loader's epoch")
    print("  %s: %d child processes while its batches are held" % (what, len(L.children())))
    del held, a, b
    gc.collect()
    no_children_within(15, what + ", then the batches released")


EXIT = r"""
import sys
import dropin_child as C
a = C.loader()
it = iter(a)
b = next(it)
x = b[1]                    # a tensor held at exit
c = C.loader(persistent_workers=True)
for k, d in enumerate(c):
    if k == 3:
        break
print("EXITING", flush=True)
%s
"""


@case
def interpreter_exit_with_live_loaders():
    """An interpreter that ends mid-epoch with two live loaders (an iterator in progress, a
    batch and a tensor held; persistent workers after a break): exit code as the script's,
    no hang, no process left in its session or re-parented here."""
    for how, rc in (("sys.exit(0)", 0), ("", 0), ("raise SystemExit(3)", 3),
                    ("raise ValueError('the script failed')", 1)):
        what = "exit mid-epoch by %r" % (how or "the end of the script")
        p = script(EXIT % how)
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise AssertionError("%s: the interpreter hung at exit" % what)
        T.check("EXITING" in out, "%s: the script did not run: %s" % (what, err[-3000:]))
        T.check(p.returncode == rc, "%s: exit %d (want %d), stderr:\n%s" % (
            what, p.returncode, rc, err[-3000:]))
        tb = err.count("Traceback")
        T.check(tb == (1 if "ValueError" in how else 0) and "terminate called" not in err
                and "Fatal" not in err, "%s: stderr:\n%s" % (what, err[-3000:]))
        nothing_left_of(p, 10, what)


L.run_cases(timeout=150)
