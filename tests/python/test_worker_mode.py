"""worker_mode="processes" (issue 12): a source string loaded by worker processes gives the same
batches (indices, rows, labels) as worker threads; a Python dataset or an unknown mode is a
ValueError."""
import os

import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=150, row_floats=100)
spec = "npy:%s,labels=%s" % (dp, lp)


def children():
    """Processes whose parent is this one (the zygote, in process mode)."""
    me, n = str(os.getpid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % pid) as f:
                n += any(line.split() == ["PPid:", me] for line in f)
        except OSError:
            pass
    return n


def batches(mode):
    out = []
    loader = stoke.DataLoader(spec, batch_size=16, shuffle=True, seed=5, num_workers=2,
                              pin_memory=False, worker_mode=mode)
    for k, b in enumerate(loader):
        if k == 0:
            want = mode == "processes"
            T.check((children() > 0) == want, "%s: %d child processes" % (mode, children()))
        out.append((np.from_dlpack(b.indices).copy(), np.asarray(b["data"]).copy(),
                    np.asarray(b["label"]).copy()))
    del loader
    return out


# processes first: the zygote is forked before this process has any loader thread
proc = batches("processes")
T.check(children() == 0, "child processes left after the loader: %d" % children())
thr = batches("threads")
T.check(len(proc) == len(thr) == 10, "batches %d %d" % (len(proc), len(thr)))
for (pi, pd, pl), (ti, td, tl) in zip(proc, thr):
    T.check(np.array_equal(pi, ti), "order differs: %s %s" % (pi, ti))
    T.check(np.array_equal(pd, td) and np.array_equal(pd, data[pi]), "rows differ at %s" % pi)
    T.check(np.array_equal(pl, tl), "labels differ at %s" % pi)


class Rows:
    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        return data[i]


for bad, kw in ((Rows(), {"worker_mode": "processes"}), (spec, {"worker_mode": "forks"})):
    try:
        stoke.DataLoader(bad, batch_size=4, num_workers=1, pin_memory=False, **kw)
    except ValueError as e:
        T.check("worker_mode" in str(e), "message: %s" % e)
    else:
        T.check(False, "no ValueError for %s" % kw)
print("ok")
