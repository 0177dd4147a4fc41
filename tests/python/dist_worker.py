"""One rank of the distributed tests: loads its share (rank and world size from the
environment: torchrun's RANK/WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, Slurm) and writes
{"rank", "world_size", "indices"} to OUTDIR/rank<R>.json."""
import json
import os
import sys

import stoke

n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
loader = stoke.DataLoader("synthetic:%d,shape=4" % n, batch_size=3, shuffle=True, seed=7,
                          num_workers=2, pin_memory=False, distributed=True)
indices = []
for b in loader:
    indices.extend(memoryview(b.indices).tolist())
with open(os.path.join(sys.argv[1], "rank%d.json" % loader.rank), "w") as f:
    json.dump({"rank": loader.rank, "world_size": loader.world_size, "indices": indices,
               "len": len(loader)}, f)
