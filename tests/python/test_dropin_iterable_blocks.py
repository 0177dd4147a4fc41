"""An IterableDataset's blocks (nothing measures its first batch before iteration): where
nothing pins them (no accelerator here, or pin_memory=False) and worker processes write them,
a block is address space whose pages exist once written, so batches over 8 MiB (images) are
written in place, with no warning, and a loader of small batches costs only what it writes.
Where an accelerator pins them (simdev, in a child process of this test), blocks stay 8 MiB and
a larger batch is made in memory of its own, with the warning naming max_batch_bytes.
loader.stats()["bytes"] counts the batches' bytes, not their blocks'."""
import os
import subprocess
import sys
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
T.no_forked_python_under_tsan()
PINNED = sys.argv[1:] == ["--simdev"]
if PINNED:
    T.use_simdev()
import stoke  # noqa: E402


class Images(torch.utils.data.IterableDataset):
    """n samples of a 3x128x128 float32 image (192 KiB) and its number, each worker its
    share: a batch of 64 is 12 MiB."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, w = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, self.n, w):
            yield torch.full((3, 128, 128), float(i)) + torch.arange(128.0), i


class Small(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 4000, info.num_workers):
            yield torch.arange(8) + i, i


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


ref = list(torch.utils.data.DataLoader(Images(640), batch_size=64, num_workers=2))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    loader = stoke.DataLoader(Images(640), batch_size=64, num_workers=2)
    got = [(x.clone(), y.clone()) for x, y in loader]
over = [str(m.message) for m in w if "max_batch_bytes" in str(m.message)]
T.check(len(got) == len(ref) == 10
        and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, ref)),
        "12 MiB batches of an IterableDataset, 2 workers: %d batches, torch's %d, equal: %s"
        % (len(got), len(ref), [torch.equal(a[0], b[0]) for a, b in zip(got, ref)]))
want = sum(t.numel() * t.element_size() for x, y in ref for t in (x, y))
nbytes = loader.stats()["bytes"]
T.check(want <= nbytes < want + 10 * 65536,
        "stats()['bytes'] %d: the batches' bytes are %d (plus their headers)" % (nbytes, want))
if PINNED:
    T.check(len(over) == 1 and "max_batch_bytes=" in over[0] and "pinned" in over[0],
            "pinned 8 MiB blocks: the batches over them are made apart, one warning: %s" % over)
    print("ok")
    sys.exit(0)
T.check(not over, "no accelerator: 12 MiB batches are written in their blocks, no warning: %s"
        % over)
del loader, got

# small batches: the blocks' address space is not memory (this process maps every block)
before = rss_mib()
loader = stoke.DataLoader(Small(), batch_size=32, num_workers=2)
n = sum(len(y) for _, y in loader)
grew = rss_mib() - before
T.check(n == 4000 and grew < 64,
        "small batches: %d samples, this process grew %.1f MiB (its blocks are %d MiB each)"
        % (n, grew, loader._writer.blob_bytes >> 20))
del loader

# pinned (simdev): in a child, which makes simdev the accelerator before stoke starts
r = subprocess.run([sys.executable, __file__, "--simdev"], stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, timeout=240)
out = r.stdout.decode(errors="replace")
if r.returncode == 77:
    print("simdev part skipped: %s" % out.strip())
else:
    T.check(r.returncode == 0 and out.rstrip().endswith("ok"),
            "the pinned case (simdev): status %d:\n%s" % (r.returncode, out))
print("ok")
