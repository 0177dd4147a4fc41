#!/usr/bin/python3
"""Where a drop-in worker's time goes per batch, for bench_dropin.py's dict and tokens_pad cases.

    /usr/bin/python3 bench/dropin_parts.py [--build build] [--rounds 7]

In one process, one thread (torch.set_num_threads(1), as a worker), on the benchmark's datasets
and batch sizes, batches of a fixed random order prepared first: the best of --rounds passes of
each part, in µs a sample.  Parts: the dataset's __getitem__ (with the samples' release), the
worker's collate into a block of ordinary memory (_Collator), its _Block.finish, torch.stack of
one column (dict), the built-in padding's C call (_stoke._pad_batch, tokens_pad) and the tensor
attribute reads it makes per sample (from Python, for comparison).  These are the costs of a
quiet, warm process; a worker of a 2-core run pays more (caches shared with the consumer and the
other worker, a context switch per batch).
"""
import argparse
import mmap
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def best(rounds, n, f, items):
    b = 1e9
    for _ in range(rounds):
        t = time.perf_counter()
        for x in items:
            f(x)
        b = min(b, time.perf_counter() - t)
    return b / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))
    sys.path.insert(0, HERE)
    import numpy as np
    import torch
    import bench_dropin as bd
    from stoke import _dropin as D
    from stoke import _stoke
    torch.set_num_threads(1)
    view = memoryview(mmap.mmap(-1, 8 << 20))
    for case in ("dict", "tokens_pad"):
        group = "dict" if case == "dict" else "tokens"
        bs = bd.BATCH[group]
        ds = bd.make_dataset(group, bd.FULL[group], None)
        nb = min(len(ds) // bs, 400 if case != "dict" else 40)
        order = np.random.default_rng(1).permutation(len(ds))[:nb * bs].tolist()
        idx = [order[i * bs:(i + 1) * bs] for i in range(nb)]
        batches = [[ds[j] for j in ix] for ix in idx]
        n = nb * bs
        col = D._Collator({"input_ids": 0} if case != "dict" else None, None, None, False)
        fast = set()

        def getitem(ix):
            [ds[j] for j in ix]

        def collate(s):
            col(D._Block(view, None, fast), s)

        def collate_finish(s):
            blk = D._Block(view, None, fast)
            blk.finish(col(blk, s))

        rows = [("__getitem__ (+ release)", best(a.rounds, n, getitem, idx)),
                ("collate into the block", best(a.rounds, n, collate, batches)),
                ("collate + finish", best(a.rounds, n, collate_finish, batches))]
        if case == "dict":
            for key in batches[0][0]:
                c0 = batches[0][0][key]
                out = torch.empty((bs,) + tuple(c0.shape), dtype=c0.dtype)
                cols = [[d[key] for d in s] for s in batches]
                rows.append(("torch.stack of %s %s" % (key, tuple(c0.shape)),
                             best(a.rounds, n, lambda c: torch.stack(c, 0, out=out), cols)))
        else:
            cols = [[d["input_ids"] for d in s] for s in batches]
            pad = col._pad_bytes("input_ids", torch.int64)
            rows.append(("_stoke._pad_batch", best(a.rounds, n, lambda c: _stoke._pad_batch(
                view, 64, c, torch.Tensor, 8, None, 0, pad), cols)))

            def attrs(c):
                for t in c:
                    t.dtype, t.shape, t.is_contiguous(), t.is_cpu, t.is_neg(), t.data_ptr()
            rows.append(("its 6 attribute reads, from Python", best(a.rounds, n, attrs, cols)))
        print("%s (batch %d, %d batches):" % (case, bs, nb))
        for name, us in rows:
            print("  %-38s %6.2f us a sample" % (name, us))


if __name__ == "__main__":
    main()
