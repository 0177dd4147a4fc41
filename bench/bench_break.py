#!/usr/bin/python3
"""What a `break` costs: the first batch of the next iteration, after a loop left mid-epoch
while the workers are busy, stoke.DataLoader against torch.utils.data.DataLoader.

    /usr/bin/python3 bench/bench_break.py [--build build] [--rounds 3] [--iters 6]
        [--sample-ms 5] [--batch-size 32] [--workers 2] [--no-persistent]

The dataset burns --sample-ms of CPU per sample (a Python transform) and returns a 16-float
tensor and its index. Each loader (the same arguments, shuffle=True, persistent_workers unless
--no-persistent, pin_memory=True) runs in a fresh process: one batch to start its workers,
then --iters times: time iter(loader) + next() (the new epoch's first batch), take two batches
more and break. The new epoch's first batch itself takes batch-size x sample-ms of a worker;
what is above it is the wait for the old epoch's work. Rounds alternate torch and stoke;
printed: each run's median, and the medians' ratio (torch / stoke: above 1, stoke's break is
cheaper)."""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(a):
    import torch
    if a.side == "stoke":
        sys.path.insert(0, os.path.join(a.build, "python"))
        import stoke
        Loader = stoke.DataLoader
    else:
        Loader = torch.utils.data.DataLoader
    burn = a.sample_ms / 1000.0

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64 * a.batch_size

        def __getitem__(self, i):
            end = time.perf_counter() + burn
            while time.perf_counter() < end:
                pass
            return torch.full((16,), float(i)), i

    dl = Loader(Slow(), batch_size=a.batch_size, num_workers=a.workers, shuffle=True,
                persistent_workers=a.persistent, pin_memory=True)
    for _ in dl:  # the workers started, one batch made
        break
    took = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        it = iter(dl)
        next(it)
        took.append(time.perf_counter() - t0)
        for k, _ in enumerate(it):  # two batches more, then leave with the workers busy
            if k == 1:
                break
        del it
    print(" ".join("%.4f" % t for t in took))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--sample-ms", type=float, default=5.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-persistent", dest="persistent", action="store_false")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.child:
        return child(a)
    print("a break, then the next iteration's first batch: %d workers, batch %d, %.1f ms a "
          "sample (a batch alone: %.3f s of a worker), persistent_workers=%s"
          % (a.workers, a.batch_size, a.sample_ms, a.batch_size * a.sample_ms / 1000,
             a.persistent))
    runs = {"torch": [], "stoke": []}
    for r in range(a.rounds):
        for side in ("torch", "stoke"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--side", side,
                   "--build", a.build, "--iters", str(a.iters), "--sample-ms", str(a.sample_ms),
                   "--batch-size", str(a.batch_size), "--workers", str(a.workers)]
            if not a.persistent:
                cmd.append("--no-persistent")
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                sys.exit("%s failed:\n%s" % (side, p.stderr[-3000:]))
            took = [float(x) for x in p.stdout.split()]
            runs[side].append(statistics.median(took))
            print("round %d %-5s %s  median %.3f s" % (r + 1, side,
                                                     " ".join("%.3f" % t for t in took),
                                                     runs[side][-1]), flush=True)
    t, s = statistics.median(runs["torch"]), statistics.median(runs["stoke"])
    print("median of the runs: torch %.3f s, stoke %.3f s: stoke's break %.2fx cheaper"
          % (t, s, t / s))


if __name__ == "__main__":
    sys.exit(main())
