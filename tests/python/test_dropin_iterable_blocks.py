"""An IterableDataset's blocks (nothing measures its first batch before iteration): where
nothing pins them (no accelerator here, or pin_memory=False) and worker processes write them,
a block is address space whose pages exist once written, so batches over 8 MiB (images) are
written in place, with no warning, and a loader of small batches costs only what it writes.
Where an accelerator pins them (simdev, in a child process of this test), blocks are as large,
and each is pinned as far as its batches use it (never whole: a backend pins every page of what
it registers): the batches are written in place, pinned, with no warning, and the registered
bytes stay near the batches'.  A block that cannot be pinned (simdev's fault injection: the
first registration) gives one warning with the reason, and the batches in ordinary memory (no
block is registered after a failure), their values right.
loader.stats()["bytes"] counts the batches' bytes, not their blocks'."""
import gc
import os
import subprocess
import sys
import warnings

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
T.no_forked_python_under_tsan()
PINNED = sys.argv[1:2] == ["--simdev"]
FAIL = sys.argv[2:] == ["--fail"]
if PINNED:
    T.use_simdev()
    if FAIL:  # simdev's first allocation after its probe: the first block's registration
        os.environ["STOKE_SIMDEV_FAIL_ALLOC"] = "1"
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
registered = []  # (simdev) the bytes registered while each batch is held
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    loader = stoke.DataLoader(Images(640), batch_size=64, num_workers=2)
    got = []
    for x, y in loader:
        # (--fail: every batch held, so that the later ones are copied out of their blocks)
        got.append((x, y) if FAIL else (x.clone(), y.clone()))
        registered.append(stoke.pinned_stats()["registered_bytes"])
over = [str(m.message) for m in w if "max_batch_bytes" in str(m.message)]
nopin = [str(m.message) for m in w if "could not be pinned" in str(m.message)]
T.check(len(got) == len(ref) == 10
        and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, ref)),
        "12 MiB batches of an IterableDataset, 2 workers: %d batches, torch's %d, equal: %s"
        % (len(got), len(ref), [torch.equal(a[0], b[0]) for a, b in zip(got, ref)]))
want = sum(t.numel() * t.element_size() for x, y in ref for t in (x, y))
nbytes = loader.stats()["bytes"]
T.check(want <= nbytes < want + 10 * 65536,
        "stats()['bytes'] %d: the batches' bytes are %d (plus their headers)" % (nbytes, want))
if PINNED:
    st = loader.stats()
    T.check(not over, "pinned blocks: 12 MiB batches are written in their blocks, no warning "
            "naming max_batch_bytes: %s" % over)
    if FAIL:
        T.check(len(nopin) == 1 and "simdev could not pin" in nopin[0],
                "a block that cannot be pinned: one warning with the reason: %s" % nopin)
        # no block is registered after the failure (the next try is 64 batches later): the
        # batches in their blocks are ordinary memory; those held past the loader's buffers
        # are copied into the pinned pool, and counted as pinned as their tensors are
        is_pinned = T.is_pinned_fn()
        pinned = [is_pinned(x) for x, _ in got]
        T.check(0 < sum(pinned) < 10 and st["pinned_batches"] == sum(pinned)
                and st["pageable_batches"] == 10 - sum(pinned),
                "the first registration failed: batches pinned %s, counted %s" % (
                    pinned, {k: st[k] for k in ("pinned_batches", "pageable_batches")}))
        T.check(stoke.pinned_stats()["register_failures"] == 1,
                "the refused registration counted once in pinned_stats: %s"
                % stoke.pinned_stats()["register_failures"])
        print("ok")
        sys.exit(0)
    T.check(not nopin and stoke.pinned_stats()["register_failures"] == 0,
            "every block pinned: %s, refused %d"
            % (nopin, stoke.pinned_stats()["register_failures"]))
    T.check(st["pinned_batches"] == 10 and st["pageable_batches"] == 0,
            "every batch pinned: %s" % {k: st[k] for k in ("pinned_batches", "pageable_batches")})
    block = loader._writer.blob_bytes
    batch = 64 * (3 * 128 * 128 * 4 + 8)
    # each block in use is pinned to the batch's bytes, an eighth more, rounded up to 2 MiB
    # (14 MiB), never whole (its address space is far larger)
    T.check(block >= 8 * batch and 0 < max(registered) <= 8 * (14 << 20)
            and max(registered) < block,
            "blocks of %d bytes pinned as used: registered bytes while batches were held %s"
            % (block, registered))
    del loader, got, x, y  # (x, y: the last batch's tensors, which keep its block)
    # every batch held (list(loader)): those past the buffers are copied out of their blocks
    # into pinned memory of their own, and their blocks pinned as used: all count as pinned
    loader = stoke.DataLoader(Images(640), batch_size=64, num_workers=2)
    held = list(loader)
    st = loader.stats()
    T.check(len(held) == 10 and st["pinned_batches"] == 10 and all(
        torch.equal(a[0], b[0]) for a, b in zip(held, ref)),
        "list(loader): %d batches, pinned %d, equal %s" % (
            len(held), st["pinned_batches"], [torch.equal(a[0], b[0]) for a, b in zip(held, ref)]))
    del loader, held
    gc.collect()
    T.check(stoke.pinned_stats()["registered_bytes"] == 0,
            "the loader gone, nothing stays registered: %d bytes"
            % stoke.pinned_stats()["registered_bytes"])
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

# pinned (simdev): in a child, which makes simdev the accelerator before stoke starts; then
# with its first registration failing
for args in (["--simdev"], ["--simdev", "--fail"]):
    r = subprocess.run([sys.executable, __file__] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=240)
    out = r.stdout.decode(errors="replace")
    if r.returncode == 77:
        T.skip("the simdev part: %s" % out.strip())
    T.check(r.returncode == 0 and out.rstrip().endswith("ok"),
            "the pinned case (simdev %s): status %d:\n%s" % (args, r.returncode, out))
print("ok")
