"""Checks the shares the ranks of a distributed run wrote (dist_worker.py)."""
import json
import os

import stoke_testlib as T


def check_shares(outdir, world, n=32):
    shares = []
    for r in range(world):
        path = os.path.join(outdir, "rank%d.json" % r)
        T.check(os.path.exists(path), "rank %d wrote nothing" % r)
        with open(path) as f:
            s = json.load(f)
        T.check(s["rank"] == r and s["world_size"] == world, "rank file %d: %s" % (r, s))
        T.check(len(s["indices"]) == -(-n // world), "rank %d: %d samples" % (r, len(s["indices"])))
        shares.append(s["indices"])
    every = sum(shares, [])
    T.check(sorted(set(every)) == list(range(n)), "the shares do not cover the dataset")
    if n % world == 0:
        T.check(len(every) == n, "the shares overlap: %s" % shares)
    return shares
