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
        if self.stall_from is not None and i >= self.stall_from and os.getpid() != PARENT:
            time.sleep(60)  # samples that never come: the caller waits on the loader
        return i, torch.arange(6, dtype=torch.float32) + 10 * i


def loader(**kw):
    return L.Loader(Rows(400), batch_size=4, num_workers=2, **kw)


def stalling_loader():
    return L.Loader(Rows(400, stall_from=40), batch_size=4, num_workers=2)


def children():
    return L.children()
