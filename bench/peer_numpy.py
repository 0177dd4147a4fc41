#!/usr/bin/python3
"""The NumPy peers of bench/peers.py: what a performance-minded user writes in a few lines.

    peer_numpy.py DATA.npy ORDER.bin --batch-size B [--mode take|fancy] [--labels L.npy]
                  [--limit SAMPLES]

The array is mapped (np.load(mmap_mode="r"), as a plain ndarray view); ORDER.bin holds the
indices to visit as little-endian uint64 (bench_tool order: stoke's shuffled order), so the
rows and their order are the same as stoke's and the C gather's.  Per batch:
  take:  np.take(arr, idx, axis=0, out=buf) into one preallocated batch buffer;
  fancy: arr[idx] (a new array per batch).
With labels, the labels of the batch are gathered the same way.  Only the loop is timed.
Prints one JSON object: samples, batches, seconds, samples_per_s, bytes_per_s, index_sum.
"""
import argparse
import json
import sys
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("order")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--mode", choices=("take", "fancy"), default="take")
    p.add_argument("--labels")
    p.add_argument("--limit", type=int, default=0, help="samples; 0 = the whole order")
    a = p.parse_args()
    arr = np.asarray(np.load(a.path, mmap_mode="r"))
    lab = np.asarray(np.load(a.labels, mmap_mode="r")) if a.labels else None
    order = np.fromfile(a.order, dtype="<u8").astype(np.intp)
    if a.limit:
        order = order[:a.limit]
    b = a.batch_size
    batches = [order[s:s + b] for s in range(0, len(order), b)]
    buf = np.empty((b,) + arr.shape[1:], dtype=arr.dtype)
    lbuf = np.empty((b,) + lab.shape[1:], dtype=lab.dtype) if lab is not None else None
    row_bytes = arr[0].nbytes + (lab[0].nbytes if lab is not None else 0)
    index_sum = 0
    t0 = time.perf_counter()
    if a.mode == "take":
        for idx in batches:
            k = len(idx)
            np.take(arr, idx, axis=0, out=buf[:k])
            if lbuf is not None:
                np.take(lab, idx, axis=0, out=lbuf[:k])
            index_sum += int(idx.sum())
    else:
        for idx in batches:
            x = arr[idx]
            if lab is not None:
                y = lab[idx]
            index_sum += int(idx.sum())
        del x
        if lab is not None:
            del y
    dt = time.perf_counter() - t0
    n = len(order)
    print(json.dumps({"samples": n, "batches": len(batches), "seconds": round(dt, 6),
                      "samples_per_s": n / dt, "bytes_per_s": n * row_bytes / dt,
                      "index_sum": index_sum, "mode": a.mode}))


if __name__ == "__main__":
    sys.exit(main())
