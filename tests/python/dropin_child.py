"""What test_dropin_procs.py's subprocesses run: loaders with process workers over small
datasets, and this process's children."""
import os
import time

import dropin_lib as L

torch = L.torch
PARENT = os.getpid()


class Rows(torch.utils.data.Dataset):
    def __init__(self, n, stall_from=None):
        self.n, self.stall_from = n, stall_from

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if (self.stall_from is not None and i >= self.stall_from and os.getpid() != PARENT
                and torch.utils.data.get_worker_info() is not None):
            time.sleep(60)  # samples that never come: the caller waits on the loader
        return i, torch.arange(6, dtype=torch.float32) + 10 * i


def loader(**kw):
    return L.Loader(Rows(400), batch_size=4, num_workers=2, **kw)


class StuckInChildren(torch.utils.data.Dataset):
    """Samples that never come from any child process (the constructor's probe included)."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if os.getpid() != PARENT:
            time.sleep(600)
        return i


def probe_stuck_loader():
    return L.Loader(StuckInChildren(), batch_size=4, num_workers=2)


def stalling_loader():
    return L.Loader(Rows(400, stall_from=40), batch_size=4, num_workers=2)


class TorchOps(torch.utils.data.Dataset):
    """Torch ops inside __getitem__ (a matmul, a large elementwise op and a reduction), exact
    in any thread count."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        m = torch.randint(-8, 8, (96, 96), generator=g).to(torch.float64)
        big = (torch.arange(300_000) * (i + 1)) % 97
        return (m @ m.T).sum(dim=0), big.sum()


def torch_ops_epochs():
    ds = TorchOps()
    want = [ds[i] for i in range(len(ds))]
    for workers in (2, 1):
        what = "workers=%d" % workers
        loader = L.Loader(ds, batch_size=6, num_workers=workers)
        got = L.epoch(loader)
        assert len(got) == 8, "%s: %d batches" % (what, len(got))
        for k, b in enumerate(got):
            for f in (0, 1):
                assert torch.equal(b[f], torch.stack([w[f] for w in want[6 * k:6 * k + 6]])), \
                    "%s: batch %d field %d differs" % (what, k, f)
        del loader


def children():
    return L.children()
