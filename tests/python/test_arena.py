"""DataLoader(arena=...) (issue 12): batches come from the node-wide pinned arena — the same rows
as without it, with simdev as the accelerator; an arena too small for the batches is an error
naming it."""
import os

import stoke_testlib as T

np = T.need("numpy")
T.use_simdev()
import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=120, row_floats=64)
spec = "npy:%s,labels=%s" % (dp, lp)
name = "pytest-%d" % os.getpid()


def epoch(**kw):
    loader = stoke.DataLoader(spec, batch_size=16, shuffle=True, seed=3, num_workers=2, **kw)
    out = []
    for b in loader:
        t = np.from_dlpack(b["data"])
        out.append((np.from_dlpack(b.indices).copy(), t.copy()))
    del loader
    return out


plain = epoch()
shared = epoch(arena=name + ":8M")
T.check(len(plain) == len(shared) == 8, "batches %d %d" % (len(plain), len(shared)))
for (pi, pd), (si, sd) in zip(plain, shared):
    T.check(np.array_equal(pi, si), "order differs")
    T.check(np.array_equal(sd, data[si]), "rows differ at %s" % si)

try:
    epoch(arena=name + ":1")  # far too small for the batches
except Exception as e:  # noqa: BLE001
    T.check(name in str(e), "the error names the arena: %s" % e)
else:
    T.check(False, "a 1-byte arena was accepted")
# arena= with pin_memory left at its default and no accelerator (none where no GPU: PoCL's CPU
# device counts only when chosen): nothing to pin, so no arena either, silently -- no warning
# that pin_memory is off (the user never set it), none that nothing pins; with an accelerator
# (a GPU machine) the arena is used: a 1-byte one fails naming it
probe = r"""
import sys, warnings
import stoke
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as ws:
    try:
        L = stoke.DataLoader(sys.argv[1], batch_size=16, num_workers=2, arena=sys.argv[2])
        for b in L:
            pass
        print("accepted pin_memory=%s" % L.pin_memory)
    except Exception as e:
        print("error:", e)
for w in ws:
    print("warning:", w.message)
print("accelerator:", stoke.accelerator())
"""
env = {k: v for k, v in os.environ.items()
       if k not in ("STOKE_PLUGIN_PATH", "STOKE_ACCELERATOR")}
import subprocess  # noqa: E402
import sys  # noqa: E402
out = subprocess.run([sys.executable, "-c", probe, spec, name + "-cpu:1"], env=env,
                     capture_output=True, text=True, timeout=120)
if "accelerator: None" in out.stdout:
    T.check(out.returncode == 0 and "accepted pin_memory=False" in out.stdout
            and "warning" not in out.stdout and "warn" not in out.stderr,
            "no accelerator, default pin_memory: %r %r" % (out.stdout, out.stderr))
else:
    T.check(out.returncode == 0 and "error:" in out.stdout and name + "-cpu" in out.stdout,
            "an accelerator, default pin_memory: the arena is used: %r" % out.stdout)
print("ok")
