"""No exit aborts after a torch-tensor dataset (TensorDataset) ran on 2 worker threads: 30
processes iterate one full epoch and exit with the loader (and a batch, and a tensor viewing
it) alive, 30 more break out mid-epoch and exit so.  Every exit code must be 0 with no
"terminate called" on stderr.  (Before: 5-10 of 30, 1-3 of 30 after a break, died of SIGABRT:
a worker thread still in __getitem__ freed a tensor while the interpreter finalized, took the
GIL, was ended by pthread_exit and unwound through libtorch.)

The processes are forked from this one after torch is imported (a fresh interpreter per run
would spend seconds importing torch each); each child exits through the normal interpreter
exit (SystemExit: atexit hooks, finalization)."""
import gc
import os
import sys
import time

import stoke_testlib as T

# forked children inherit TSan's options: threads left to the process exit are by design here
tsan = os.environ.get("TSAN_OPTIONS")
if tsan is not None and "report_thread_leaks=0" not in tsan:
    env = dict(os.environ, TSAN_OPTIONS=tsan + ":report_thread_leaks=0")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

torch = T.need("torch")
from torch.utils.data import TensorDataset  # noqa: E402

import stoke  # noqa: E402

RUNS = 30  # per mode
PARALLEL = 3
KEEP = []
X = torch.randn(512, 3, 8, 8)
Y = torch.arange(512)


def child(mode):
    loader = stoke.DataLoader(TensorDataset(X, Y), batch_size=16, num_workers=2,
                              pin_memory=False)
    for i, b in enumerate(loader):
        t = torch.from_dlpack(b["data"])
        if mode == "break" and i == 10:
            break
    KEEP.append((loader, b, t))  # alive at exit
    sys.exit(0)  # the normal exit: SystemExit, atexit hooks, finalization


def spawn(mode, k):
    err = os.path.join(d, "%s-%d.err" % (mode, k))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.dup2(fd, 1)
        child(mode)
    return pid, mode, k, err, time.monotonic() + 60


# the parent's objects frozen: the children's exit does not collect them (half its CPU time)
gc.freeze()
d = T.tmpdir()
todo = [(m, k) for m in ("full", "break") for k in range(RUNS)]
running, results = [], []
start = time.monotonic()
while todo or running:
    while todo and len(running) < PARALLEL:
        running.append(spawn(*todo.pop(0)))
    for r in list(running):
        pid, mode, k, err, deadline = r
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done and time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            done, status = pid, -1
        if done:
            running.remove(r)
            with open(err) as f:
                results.append((mode, k, status, f.read()))
    time.sleep(0.005)
print("%d exits in %.1f s" % (len(results), time.monotonic() - start))
bad = [(m, k, os.waitstatus_to_exitcode(s) if s >= 0 else "hung", t[-300:])
       for m, k, s, t in results if s != 0 or "terminate called" in t or "Fatal" in t]
T.check(not bad, "%d of %d exits failed: %s" % (len(bad), len(results), bad[:3]))
print("ok")
