"""Two Python threads on one DataLoader (the C loader takes one consumer at a time): iterating
it from both, sharing one iterator, or iterating while another thread calls set_epoch /
load_state_dict never hangs; each call either works or raises RuntimeError("... DataLoader is
being used by another thread ...").  (Before: a deadlock in the loader's wait_done / quiesce.)
Each scenario's threads are joined with a bound."""
import os
import sys
import threading
import time

import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

BUSY = "DataLoader is being used by another thread"


class Slow:
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.0005)  # next() waits for the workers, without the GIL
        return np.full(4, i, dtype=np.int64)


def run(name, *bodies):
    """Runs each body in its own thread; returns the errors they raised (each must be the
    busy RuntimeError) and the calls that worked."""
    errors, done = [], []

    def wrap(body):
        try:
            body(done)
        except RuntimeError as e:
            errors.append(e)
        except BaseException as e:  # noqa: BLE001
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
        T.check(isinstance(e, RuntimeError) and BUSY in str(e),
                "%s: %s: %s" % (name, type(e).__name__, e))
    return errors, done


def make():
    return stoke.DataLoader(Slow(), batch_size=4, num_workers=1, pin_memory=False,
                            prefetch_factor=2)


def iterate(loader, epochs=3):
    def body(done):
        for _ in range(epochs):
            for b in loader:
                del b
                done.append(1)
    return body


# 1. two threads iterating one loader (each iter() starts a pass)
loader = make()
errors, done = run("iterate+iterate", iterate(loader), iterate(loader))
print("iterate+iterate: %d batches, %d busy errors" % (len(done), len(errors)))

# 2. two threads sharing one iterator
loader = make()
it = iter(loader)


def share(done):
    for b in it:
        del b
        done.append(1)


errors, done = run("shared iterator", share, share)
print("shared iterator: %d batches, %d busy errors" % (len(done), len(errors)))
if not errors:
    T.check(len(done) == len(loader), "batches %d of %d" % (len(done), len(loader)))

# 3. iterate while another thread calls set_epoch and load_state_dict
loader = make()
state = loader.state_dict()


def meddle(done):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            loader.set_epoch(0)
            loader.load_state_dict(state)
            done.append(2)
        except RuntimeError as e:
            T.check(BUSY in str(e), "set_epoch: %s" % e)
        time.sleep(0.001)


errors, done = run("iterate+set_epoch", iterate(loader, epochs=2), meddle)
print("iterate+set_epoch: %d calls, %d busy errors" % (len(done), len(errors)))

# 4. after all that each loader still works from one thread
for b in make():
    del b
n = sum(len(b) for b in loader)
T.check(n == 400, "a full pass after the concurrent use: %d samples" % n)
print("ok")
sys.stdout.flush()
