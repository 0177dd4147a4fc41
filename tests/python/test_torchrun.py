"""2 ranks started by `torchrun --standalone --nproc_per_node 2` (RANK/WORLD_SIZE set by
torchrun) load disjoint shares covering the dataset."""
import os
import shutil
import subprocess
import sys

import stoke_testlib as T

T.need("numpy")
from dist_check import check_shares  # noqa: E402

torchrun = shutil.which("torchrun")
if not torchrun:
    T.skip("torchrun is not installed (Debian python3-torch)")
HERE = os.path.dirname(os.path.abspath(__file__))
out = T.tmpdir()
env = dict(os.environ)
for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
          "SLURM_NTASKS"):
    env.pop(k, None)
# --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 cannot parse their default "0" (its
# Std flag lookup iterates the enum, which no longer yields the 0 member), and fails before
# starting any worker.
r = subprocess.run([torchrun, "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
                    "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(out, "logs"),
                    os.path.join(HERE, "dist_worker.py"), out],
                   env=env, capture_output=True, text=True, timeout=240)
if r.returncode != 0:
    raise AssertionError("torchrun failed (%d): %s %s" % (r.returncode, r.stdout, r.stderr))
check_shares(out, 2)
print("ok")
