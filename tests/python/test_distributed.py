"""Distributed sharding: explicit rank=/world_size= (DistributedSampler's split and padding),
torchrun's RANK/WORLD_SIZE in the environment, and `stoke load --distributed`."""
import json
import os
import subprocess
import sys

import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402
from dist_check import check_shares  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def share(n, rank, world, **kw):
    loader = stoke.DataLoader("synthetic:%d,shape=4" % n, batch_size=3, shuffle=True, seed=7,
                              num_workers=2, pin_memory=False, rank=rank, world_size=world, **kw)
    T.check(loader.rank == rank and loader.world_size == world, "rank %d/%d" % (rank, world))
    return sum((np.from_dlpack(b.indices).tolist() for b in loader), [])


# 1. explicit: 4 ranks of 32 are disjoint and cover; of 30, the order is padded from its start
whole = share(32, 0, 1)
T.check(sorted(whole) == list(range(32)), "one rank of one: %s" % whole)
shares = [share(32, r, 4) for r in range(4)]
T.check(sorted(sum(shares, [])) == list(range(32)), "4 ranks of 32: %s" % shares)
T.check(all(s == whole[r::4] for r, s in enumerate(shares)), "not DistributedSampler's split")
order30 = share(30, 0, 1)
shares30 = [share(30, r, 4) for r in range(4)]
padded = order30 + order30[:2]
T.check(all(s == padded[r::4] for r, s in enumerate(shares30)), "padding: %s" % shares30)
dropped = [share(30, r, 4, drop_last=True) for r in range(4)]
# drop_last drops partial batches (as torch's DataLoader), not the padding of the split
T.check(all(s == padded[r::4][:6] for r, s in enumerate(dropped)), "drop_last: %s" % dropped)

# 2. torchrun's variables, set by hand, in separate processes
out = T.tmpdir()
env = dict(os.environ)
for r in range(2):
    env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
    subprocess.run([sys.executable, os.path.join(HERE, "dist_worker.py"), out], env=env,
                   check=True, timeout=120)
check_shares(out, 2)

# 3. the CLI: --distributed takes RANK/WORLD_SIZE too (rank 1 of 4 of 30: indices 1, 5, ... 29)
cli = os.environ.get("STOKE_CLI")
if cli and os.path.exists(cli):
    env = dict(os.environ, RANK="1", WORLD_SIZE="4")
    r = subprocess.run([cli, "load", "synthetic:30,shape=4", "--batch-size", "4",
                        "--distributed", "--no-pin-memory", "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    T.check(r.returncode == 0, "stoke load: %s" % r.stderr)
    j = json.loads(r.stdout)
    T.check(j["samples"] == 8 and j["index_sum"] == sum(range(1, 30, 4)), "cli: %s" % r.stdout)
    # the split in use is printed: rank and world size in --json, "rank 1 of 4" in the text
    T.check(j["distributed"] is True and j["rank"] == 1 and j["world_size"] == 4,
            "cli --json: distributed %s, rank %s, world_size %s" % (
                j.get("distributed"), j.get("rank"), j.get("world_size")))
    r = subprocess.run([cli, "load", "synthetic:30,shape=4", "--batch-size", "4",
                        "--distributed", "--no-pin-memory"],
                       env=env, capture_output=True, text=True, timeout=120)
    T.check(r.returncode == 0 and "; rank 1 of 4" in r.stdout, "cli text: %s" % r.stdout)
    r = subprocess.run([cli, "load", "synthetic:30,shape=4", "--no-pin-memory", "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    j = json.loads(r.stdout)
    T.check(j["distributed"] is False and j["rank"] == 0 and j["world_size"] == 1
            and j["samples"] == 30, "cli without --distributed: %s" % r.stdout)
print("ok")
