#!/usr/bin/python3
"""stoke's Python DataLoader vs PyTorch's DataLoader, from a training-loop-shaped Python loop.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py [--rows 50000]
        [--row-floats 768] [--batch 256] [--workers 2] [--repeat 3] [--workdir DIR] [--out F]
        [--build build]

One .npy of ROWS rows of ROW_FLOATS float32 (768: 3 KB rows), shuffled, batch BATCH.  Each
loop iterates one epoch in Python and touches every batch as a torch tensor (the tensor is made,
its shape read and its last element read back: `t[-1, -1].item()`).

Configurations (stoke with 1 and WORKERS threads, the best counting; every one timed over REPEAT epochs of the same loader, persistent workers, the
best epoch counting: worker start-up is left out for both sides, the machine is shared):
  stoke             stoke.DataLoader("npy:FILE"), torch.from_dlpack(batch["data"]) (no copy)
  torch per-sample  DataLoader(ds, batch_size, shuffle=True): __getitem__(i) -> a row tensor,
                    default collate (torch.stack) in the workers; num_workers 0 and WORKERS
  torch batched     DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch),
                    batch_size=None): __getitem__(list) -> one fancy-indexed read; 0 and WORKERS

Python-side overhead per batch: the cost of one iteration when there is nothing to load (1-byte
samples, batch 1, loading in the caller's thread, so the C loader's own work is included: an
upper bound), with and without torch.from_dlpack, against torch's DataLoader doing the same
(batch_size=None over a dataset returning one tensor).  Prints a table and writes JSON.
"""
import argparse
import json
import os
import subprocess
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "build", "python"))
import stoke  # noqa: E402


class Rows(Dataset):
    """Per-sample access to the .npy (memory-mapped), as a torch user writes it."""

    def __init__(self, path):
        self.path = path
        self.arr = None
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.arr is None:  # opened in the worker
            self.arr = np.load(self.path, mmap_mode="r")
        if isinstance(i, list):  # batched: one read of the whole batch
            return torch.from_numpy(self.arr[np.asarray(i)])
        return torch.from_numpy(np.array(self.arr[i]))


def make_npy(workdir, rows, floats):
    path = os.path.join(workdir, "rows_%dx%d_f32.npy" % (rows, floats))
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        np.save(path, rng.standard_normal((rows, floats), dtype=np.float32))
    return path


def touch(t):
    return t.shape[0] + t[-1, -1].item() * 0


def stoke_epoch(loader):
    n = 0
    for b in loader:
        t = torch.from_dlpack(b["data"])
        n += touch(t)
    return n


def torch_epoch(loader):
    n = 0
    for t in loader:
        n += touch(t)
    return n


def best_rate(epoch_fn, loader, repeat, rows):
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = epoch_fn(loader)
        dt = time.perf_counter() - t0
        if n != rows:
            raise SystemExit("delivered %d samples of %d" % (n, rows))
        best = dt if best is None else min(best, dt)
    return rows / best


def per_batch_us(fn, loader):
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        n = fn(loader)
        dt = (time.perf_counter() - t0) / n * 1e6
        best = dt if best is None else min(best, dt)
    return best


def loop_only(loader):
    n = 0
    for _ in loader:
        n += 1
    return n


def loop_dlpack(loader):
    n = 0
    for b in loader:
        torch.from_dlpack(b["data"])
        n += 1
    return n


class Tiny(Dataset):
    def __len__(self):
        return 50000

    def __getitem__(self, i):
        return TINY


TINY = torch.zeros(1)


def overheads():
    """Python-side cost per batch, with nothing to load (1-byte samples, batch 1, loading in
    the caller's thread: the C loader's own work is included, so this is an upper bound)."""
    sl = stoke.DataLoader("synthetic:50000,shape=1", batch_size=1, num_workers=0,
                          pin_memory=False)
    out = {"stoke_next_us": per_batch_us(loop_only, sl),
           "stoke_next_from_dlpack_us": per_batch_us(loop_dlpack, sl)}
    b = next(iter(sl))
    f = b["data"]
    n = 100000
    t0 = time.perf_counter()
    for _ in range(n):
        b["data"].__dlpack__()
    out["stoke_field_capsule_us"] = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        torch.from_dlpack(f)
    out["torch_from_dlpack_us"] = (time.perf_counter() - t0) / n * 1e6
    del b, f, sl
    tl = DataLoader(Tiny(), batch_size=None, num_workers=0)
    out["torch_next_us"] = per_batch_us(loop_only, tl)
    return out


def gather_bound(build, path, batch, threads, repeat):
    """The memory ceiling: bench_tool's C gather of shuffled rows into a batch buffer with
    `threads` threads, no Python, best of `repeat`; None when bench_tool is not built."""
    tool = os.path.join(build, "bench", "bench_tool")
    if not os.access(tool, os.X_OK):
        return None
    best = 0.0
    for _ in range(repeat):
        out = subprocess.run([tool, "gather", path, "--batch", str(batch), "--threads",
                              str(threads)], capture_output=True, text=True, check=True).stdout
        best = max(best, json.loads(out)["samples_per_s"])
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--row-floats", type=int, default=768)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "stoke-bench-py"))
    ap.add_argument("--out")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"),
                    help="build directory with bench/bench_tool (the C gather ceiling)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = make_npy(a.workdir, a.rows, a.row_floats)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)  # no accelerator here: not pinned, said once
    res = {"rows": a.rows, "row_bytes": a.row_floats * 4, "batch": a.batch,
           "workers": a.workers, "stoke_version": stoke.version, "torch": torch.__version__,
           "accelerator": (stoke.accelerator() or {}).get("backend")}

    stoke_rates = {}
    for w in sorted({1, a.workers}):
        sl = stoke.DataLoader("npy:" + path, batch_size=a.batch, shuffle=True, num_workers=w)
        stoke_epoch(sl)  # warm: page cache, threads
        stoke_rates["stoke w=%d" % w] = best_rate(stoke_epoch, sl, a.repeat, a.rows)
        del sl
    res["stoke_configs"] = stoke_rates
    res["stoke"] = max(stoke_rates.values())

    ds = Rows(path)
    torch_rates = {}
    for w in sorted({0, a.workers}):
        kw = dict(num_workers=w, persistent_workers=w > 0)
        per = DataLoader(ds, batch_size=a.batch, shuffle=True, **kw)
        bat = DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), a.batch, False),
                         batch_size=None, **kw)
        for name, loader in (("torch per-sample w=%d" % w, per), ("torch batched w=%d" % w, bat)):
            torch_epoch(loader)
            torch_rates[name] = best_rate(torch_epoch, loader, a.repeat, a.rows)
        del per, bat
    res["torch"] = torch_rates
    best_name = max(torch_rates, key=torch_rates.get)
    res["torch_best"] = best_name
    res["ratio"] = res["stoke"] / torch_rates[best_name]
    res["bound"] = gather_bound(a.build, path, a.batch, a.workers, a.repeat)
    if res["bound"]:
        res["bound_ratio"] = res["bound"] / torch_rates[best_name]

    print("%-26s %14s" % ("loader", "samples/s"))
    for k, v in stoke_rates.items():
        print("%-26s %14.0f" % (k, v))
    for k, v in torch_rates.items():
        print("%-26s %14.0f" % (k, v))
    print("ratio best stoke / best torch (%s): %.1fx" % (best_name, res["ratio"]))
    if res["bound"]:
        print("ceiling: C gather of the same rows, %d threads, no Python: %.0f samples/s = "
              "%.1fx best torch; stoke reaches %.2f of it"
              % (a.workers, res["bound"], res["bound_ratio"], res["stoke"] / res["bound"]))
    else:
        print("ceiling: n/a (bench_tool not built in %s)" % a.build)
    res["overhead"] = o = overheads()
    print("Python-side cost per batch (1-byte samples, batch 1, no workers):")
    print("  stoke next()                          %6.2f us" % o["stoke_next_us"])
    print("  stoke next() + torch.from_dlpack      %6.2f us" % o["stoke_next_from_dlpack_us"])
    print("    of which batch['data'].__dlpack__() %6.2f us" % o["stoke_field_capsule_us"])
    print("    of which torch.from_dlpack (torch)  %6.2f us" % o["torch_from_dlpack_us"])
    print("  torch DataLoader next() (batch_size=None) %6.2f us" % o["torch_next_us"])
    out = a.out or os.path.join(a.workdir, "bench_python.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
