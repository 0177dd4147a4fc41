"""A container's 64 MiB /dev/shm (Docker's default; issue 27): in a mount namespace with a 64 MiB
tmpfs on /dev/shm, 2 process workers load batches of 64 float32 3x224x224 images (38.5 MB a
batch, 4 in flight: more than /dev/shm holds, where torch's DataLoader puts a shared-memory
file per tensor) and the epoch completes with every image its own, and nothing is left in
/dev/shm.  Needs root (or a user namespace) for unshare -m and the mount: skipped otherwise."""
import os
import shutil
import subprocess
import sys

import stoke_testlib as T

T.no_forked_python_under_tsan()

SIZE = 64 << 20

if sys.argv[1:] != ["--inner"]:
    T.need("torch")
    if not shutil.which("unshare"):
        T.skip("unshare is not installed")
    mount = "mount -t tmpfs -o size=64m tmpfs /dev/shm"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        T.skip("no mount namespace with a tmpfs here (%s)" % probe.stderr.strip())
    rc = subprocess.run(["unshare", "-m", "sh", "-c", mount + ' && exec "$0" "$@"',
                         sys.executable, os.path.abspath(__file__), "--inner"],
                        timeout=240).returncode
    sys.exit(rc)

import dropin_lib as L  # noqa: E402

torch = L.torch
from torch.utils.data import Dataset  # noqa: E402

st = os.statvfs("/dev/shm")
T.check(st.f_blocks * st.f_frsize == SIZE, "/dev/shm is %d bytes" % (st.f_blocks * st.f_frsize))
T.check(not os.listdir("/dev/shm"), "/dev/shm not empty: %s" % os.listdir("/dev/shm"))


def image(i):
    return torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(i))


class Images(Dataset):
    def __len__(self):
        return 64 * 4 + 10

    def __getitem__(self, i):
        return image(i), i


@L.case
def epoch_in_64mib_shm():
    loader = L.Loader(Images(), batch_size=64, num_workers=2)
    T.check(len(loader) == 5, "len %d" % len(loader))
    n, sizes = 0, []
    for x, y in loader:
        T.check(x.dtype == torch.float32 and x.shape[1:] == (3, 224, 224), "batch %s" % (
            L.describe(x),))
        T.check(y.tolist() == list(range(n, n + len(y))), "labels %s" % y.tolist()[:8])
        for k in range(len(y)):
            T.check(torch.equal(x[k], image(n + k)), "image %d differs" % (n + k))
        sizes.append(len(y))
        n += len(y)
    T.check(n == 266 and sizes == [64, 64, 64, 64, 10], "batches of %s" % sizes)
    used = os.statvfs("/dev/shm")
    del loader, x, y
    L.no_children_within(15, "after the loader")
    T.check(not os.listdir("/dev/shm"), "left in /dev/shm: %s" % os.listdir("/dev/shm"))
    print("  /dev/shm used at the end of the epoch: %d of %d bytes" % (
        (used.f_blocks - used.f_bfree) * used.f_frsize, SIZE))


L.run_cases(timeout=180)
