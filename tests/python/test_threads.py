"""Two Python threads on one DataLoader over a Python dataset (the C loader takes one consumer at
a time), with a worker process (the default) and with worker_mode="threads": iterating it from
both, sharing one iterator, or iterating while another thread calls set_epoch /
load_state_dict never hangs; each call either works or raises RuntimeError("... DataLoader is
being used by another thread ..."), or, on an iterator shared by two threads, Python's
ValueError("generator already executing") (a Python dataset's iterator is a generator); no
batch is delivered twice in a pass, and every batch holds its own samples.  (Before: a
deadlock in the loader's wait_done / quiesce.)  Each scenario's threads are joined with a
bound."""
import os
import sys
import threading
import time

import stoke_testlib as T

T.no_forked_python_under_tsan()

np = T.need("numpy")
T.need("torch")
import stoke  # noqa: E402

BUSY = "DataLoader is being used by another thread"
SHARED = "generator already executing"
N, BS = 400, 4


class Slow:
    def __len__(self):
        return N

    def __getitem__(self, i):
        time.sleep(0.0005)  # next() waits for the workers, without the GIL
        return np.full(4, i, dtype=np.int64)


def run(name, *bodies, shared=False):
    """Runs each body in its own thread; returns the errors they raised (each must be the
    busy RuntimeError, the superseded iterator's, or with a shared iterator the generator's
    ValueError) and the
    calls that worked."""
    errors, done = [], []

    def wrap(body):
        try:
            body(done)
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if any(t.is_alive() for t in threads):
        print("FAIL: %s: a thread still runs after 60 s (deadlock)" % name, flush=True)
        os._exit(1)  # exiting normally would wait on the hung loader too
    for e in errors:
        # (a thread's `for` whose iterator another thread's iter() replaced: superseded)
        T.check((isinstance(e, RuntimeError) and (BUSY in str(e) or "superseded" in str(e)))
                or (shared and type(e) is ValueError and SHARED in str(e)),
                "%s: %s: %s" % (name, type(e).__name__, e))
    return errors, done


def first(b):
    """The batch's first sample index, after checking each row is its own sample's."""
    T.check(b.shape == (BS, 4) and bool((b == b[:, :1]).all())
            and b[:, 0].tolist() == list(range(int(b[0, 0]), int(b[0, 0]) + BS)),
            "a batch that is not 4 consecutive samples: %s" % b.tolist())
    return int(b[0, 0])


def scenarios(mode):
    def make():
        return stoke.DataLoader(Slow(), batch_size=BS, num_workers=1, pin_memory=False,
                                prefetch_factor=2, worker_mode=mode)

    def iterate(loader, epochs=3):
        def body(done):
            for _ in range(epochs):
                for b in loader:
                    done.append(first(b))
                    del b
        return body

    # 1. two threads iterating one loader (each iter() starts a pass)
    loader = make()
    errors, done = run("%s: iterate+iterate" % mode, iterate(loader), iterate(loader))
    print("%s: iterate+iterate: %d batches, %d busy errors" % (mode, len(done), len(errors)))
    # (a whole pass, unless both threads stopped: one on a busy error while the other's iter()
    # superseded its iterator)
    T.check(len(done) >= N // BS or len(errors) == 2,
            "%s: %d batches in all, %d errors" % (mode, len(done), len(errors)))

    # 2. two threads sharing one iterator: together one pass, no batch twice
    loader = make()
    it = iter(loader)

    def share(done):
        for b in it:
            done.append(first(b))
            del b

    errors, done = run("%s: shared iterator" % mode, share, share, shared=True)
    print("%s: shared iterator: %d batches, %d errors (%s)"
          % (mode, len(done), len(errors), ", ".join(type(e).__name__ for e in errors)))
    T.check(len(set(done)) == len(done), "%s: a batch delivered twice: %s" % (mode, sorted(done)))
    if not any(isinstance(e, RuntimeError) for e in errors):  # the generator went on
        T.check(sorted(done) == list(range(0, N, BS)),
                "%s: batches %d of %d" % (mode, len(done), len(loader)))

    # 3. iterate while another thread calls set_epoch and load_state_dict
    loader = make()
    state = loader.state_dict()

    def meddle(done):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                loader.set_epoch(0)
                loader.load_state_dict(state)
                done.append(-1)
            except RuntimeError as e:
                T.check(BUSY in str(e), "set_epoch: %s" % e)
            time.sleep(0.001)

    errors, done = run("%s: iterate+set_epoch" % mode, iterate(loader, epochs=2), meddle)
    print("%s: iterate+set_epoch: %d calls, %d busy errors"
          % (mode, done.count(-1), len(errors)))

    # 4. after all that each loader still works from one thread: a full pass, in order
    for b in make():
        del b
    starts = [first(b) for b in loader]
    T.check(starts == list(range(0, N, BS)),
            "%s: a full pass after the concurrent use: %s" % (mode, starts[:8]))


for mode in ("processes", "threads"):
    scenarios(mode)
print("ok")
sys.stdout.flush()
