#!/usr/bin/python3
"""How long the drop-in takes to start: the constructor, then iter() to the first batch and the
first to the second (each worker process's first batch: worker k makes batch k), for
bench_dropin.py's datasets at 2 worker processes, against torch.utils.data.DataLoader with the
same arguments (shuffle=True, pin_memory=True), or against another stoke build (--against).

    /usr/bin/python3 bench/dropin_start.py [--build build] [--against OTHER_BUILD]
        [--cases dict,tensor,tokens] [--runs 8]

Each run is a fresh process (worker start-up is what is measured); the two sides alternate
run by run. Printed: per case and side, the medians in ms; a worker's start is the fork of the
zygote's copy of this process (its page tables), its seeding, and its first batch's
copy-on-write faults (docs/bench.md, "The workers' start")."""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = {"dict": 512, "tensor": 256, "tokens": 32}
SAMPLES = {"dict": 60000, "tensor": 100000, "tokens": 40000}


def child(side, build, case):
    import time
    sys.path.insert(0, HERE)
    import bench_dropin as B
    if side == "torch":
        from torch.utils.data import DataLoader
    else:
        sys.path.insert(0, os.path.join(build, "python"))
        from stoke import DataLoader
    ds = B.make_dataset(case, SAMPLES[case], None)
    kw = {"collate_fn": B.pad_collate} if case == "tokens" else {}
    t0 = time.perf_counter()
    loader = DataLoader(ds, batch_size=BATCH[case], shuffle=True, num_workers=2, pin_memory=True,
                        **kw)
    t1 = time.perf_counter()
    it = iter(loader)
    next(it)
    t2 = time.perf_counter()
    next(it)
    t3 = time.perf_counter()
    print(json.dumps([(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--against", help="another stoke build instead of torch")
    ap.add_argument("--cases", default="dict,tensor,tokens")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    sides = [("stoke", os.path.abspath(a.build))]
    sides.append(("stoke " + a.against, os.path.abspath(a.against)) if a.against
                 else ("torch", ""))
    got = {}
    for r in range(a.runs):
        for case in a.cases.split(","):
            for name, build in sides if r % 2 == 0 else sides[::-1]:
                side = "torch" if name == "torch" else "stoke"
                out = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__),
                                      "--child", side, build, case],
                                     capture_output=True, text=True, timeout=300)
                lines = out.stdout.strip().splitlines()
                if out.returncode != 0 or not lines:
                    sys.exit("%s %s failed:\n%s" % (name, case, out.stderr[-2000:]))
                got.setdefault((case, name), []).append(json.loads(lines[-1]))
    print("%-7s %-28s %9s %10s %10s   (medians of %d runs, ms)" % (
        "case", "loader", "ctor", "1st batch", "2nd batch", a.runs))
    for case in a.cases.split(","):
        for name, _ in sides:
            v = got[(case, name)]
            print("%-7s %-28s %9.1f %10.1f %10.1f" % (
                case, name, *(statistics.median(x[k] for x in v) for k in range(3))))


if __name__ == "__main__":
    main()
