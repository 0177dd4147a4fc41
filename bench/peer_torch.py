#!/usr/bin/python3
"""The PyTorch peers of bench/peers.py: DataLoader per sample (the default) and batched.

    peer_torch.py DATA.npy --batch-size B --workers W [--mode sample|batched] [--labels L.npy]
                  [--limit SAMPLES] [--seed 0]

sample:  DataLoader(ds, batch_size=B, shuffle=True, num_workers=W); ds[i] returns
         (torch.from_numpy(np.array(arr[i])), label or i, i) and the default collate stacks them.
batched: DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), B, drop_last=False),
         batch_size=None, num_workers=W); ds[list] returns torch.from_numpy(arr[idx]) (one
         fancy-indexing gather per batch), the labels' arr[idx], and the indices.
The file is mapped lazily in each worker.  The order is torch's own RandomSampler's (a user's
order), so only a whole epoch's index_sum can be compared with stoke's.  The loop is timed from
the creation of the iterator (worker start included, as a user's epoch sees it).
Prints one JSON object: samples, batches, seconds, samples_per_s, bytes_per_s, index_sum.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


class Rows(Dataset):
    def __init__(self, path, labels, batched):
        self.path, self.labels_path, self.batched = path, labels, batched
        self.arr = self.lab = None
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def _open(self):
        self.arr = np.asarray(np.load(self.path, mmap_mode="r"))
        if self.labels_path:
            self.lab = np.asarray(np.load(self.labels_path, mmap_mode="r"))

    def __getitem__(self, i):
        if self.arr is None:  # opened lazily so that each worker maps the file itself
            self._open()
        if self.batched:
            idx = np.asarray(i, dtype=np.intp)
            x = torch.from_numpy(self.arr[idx])
            y = torch.from_numpy(self.lab[idx]) if self.lab is not None else None
            return x, y, torch.from_numpy(idx)
        x = torch.from_numpy(np.array(self.arr[i]))
        return x, (int(self.lab[i]) if self.lab is not None else i), i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--mode", choices=("sample", "batched"), default="sample")
    p.add_argument("--labels")
    p.add_argument("--limit", type=int, default=0, help="stop after this many samples; 0 = epoch")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    ds = Rows(a.path, a.labels, a.mode == "batched")
    g = torch.Generator().manual_seed(a.seed)
    if a.mode == "batched":
        sampler = BatchSampler(RandomSampler(ds, generator=g), a.batch_size, drop_last=False)
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=a.workers)
    else:
        loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                            generator=g)
    samples = batches = nbytes = index_sum = 0
    t0 = time.perf_counter()
    for x, y, idx in loader:
        samples += x.shape[0]
        batches += 1
        nbytes += x.numel() * x.element_size()
        if a.labels:
            nbytes += y.numel() * y.element_size()
        index_sum += int(idx.sum())
        if a.limit and samples >= a.limit:
            break
    dt = time.perf_counter() - t0
    print(json.dumps({"samples": samples, "batches": batches, "seconds": round(dt, 6),
                      "samples_per_s": samples / dt, "bytes_per_s": nbytes / dt,
                      "index_sum": index_sum, "mode": a.mode, "workers": a.workers}))


if __name__ == "__main__":
    sys.exit(main())
