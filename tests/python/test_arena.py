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
print("ok")
