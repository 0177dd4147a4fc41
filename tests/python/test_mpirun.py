"""4 ranks under `mpirun --oversubscribe -np 4` (Open MPI's OMPI_COMM_WORLD_RANK/SIZE) load
disjoint shares covering the dataset."""
import os
import shutil
import subprocess
import sys

import stoke_testlib as T

T.need("numpy")
from dist_check import check_shares  # noqa: E402

mpirun = shutil.which("mpirun")
if not mpirun:
    T.skip("mpirun is not installed (Debian openmpi-bin)")
HERE = os.path.dirname(os.path.abspath(__file__))
out = T.tmpdir()
cmd = [mpirun, "--oversubscribe", "-np", "4"]
if os.geteuid() == 0:
    cmd.append("--allow-run-as-root")
env = dict(os.environ, OMPI_MCA_plm="isolated", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMPI_MCA_rmaps_base_oversubscribe="1")
for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
    env.pop(k, None)
# A sanitizer build preloads its runtime into python: give it to the ranks only, not to mpirun
# (Open MPI itself is not what is being checked).
preload = env.pop("LD_PRELOAD", None)
if preload:
    cmd += ["-x", "LD_PRELOAD=" + preload]
    for k in ("ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"):
        if k in env:
            cmd += ["-x", k]
r = subprocess.run(cmd + [sys.executable, os.path.join(HERE, "dist_worker.py"), out],
                   env=env, capture_output=True, text=True, timeout=240)
if r.returncode != 0:
    raise AssertionError("mpirun failed (%d): %s %s" % (r.returncode, r.stdout, r.stderr))
check_shares(out, 4)
print("ok")
