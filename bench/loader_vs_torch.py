#!/usr/bin/python3
"""stoke vs PyTorch's DataLoader on the same .npy files, in one run.

    /usr/bin/python3 bench/loader_vs_torch.py [--build BUILD] [--workdir DIR] [--repeat 3]
                                              [--rows 100000] [--big-rows 5000] [--out FILE]

1. Makes the .npy files with ../shared/bench/make_npy.py (kept in --workdir and reused when
   they already have the right size; --regen rewrites them): ROWS x 3x32x32 and BIG_ROWS x
   3x224x224, uint8.
2. Case "cifar": `stoke load npy:FILE --batch-size 256 --workers 2 --shuffle --json` against
   ../shared/bench/torch_loader.py with 0 and 2 workers; ratio = stoke / torch's best.
   Target: >= 10x.
3. Case "imagenet": 3x224x224 rows, batch 64, shuffle, 2 workers: delivered bytes/s against
   single-thread memcpy bandwidth measured in the same run (BUILD/bench/stoke_memcpy_bw).
   Target: >= 50%.
4. Peak memory of the stoke runs: the kernel's peak RSS of the process (/usr/bin/time's %M)
   and the peak of RssAnon+RssShmem sampled from /proc every 5 ms, each over the baseline of a
   one-sample run (libraries and accelerator probes), against the bound
   (prefetch x workers + 2) batches + 8 MiB.  With io=mmap the pages
   of the mapped file that were touched count in RSS (shared, clean, reclaimable page cache), so
   the large case also runs with io=pread, whose RSS holds only the process's own memory.

Each timed configuration runs --repeat times; the best run counts (the machine is shared).
Prints a table and writes every figure as JSON (--out, default WORKDIR/bench_results.json).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "bench")
PYTHON = "/usr/bin/python3"
MIB = 1 << 20


def proc_mem(pid):
    """(RssAnon + RssShmem, VmHWM) in bytes, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kv = {}
            for line in f:
                k, _, v = line.partition(":")
                if k in ("RssAnon", "RssShmem", "VmHWM"):
                    kv[k] = int(v.split()[0]) * 1024
        return kv.get("RssAnon", 0) + kv.get("RssShmem", 0), kv.get("VmHWM", 0)
    except (OSError, ValueError):
        return None


def child_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except (OSError, ValueError):
        return None


def run(cmd, poll_mem=False):
    """Runs cmd; returns (stdout, stderr, peak_rss_bytes, peak_anon_bytes).

    With poll_mem the command runs under /usr/bin/time, whose fork()ed child starts from time's
    tiny image: the peak RSS it reports is the command's own.  (wait4's ru_maxrss of a child we
    spawn would inherit this Python process's high-water mark through vfork+exec.)"""
    out_path = os.path.join(ARGS.workdir, ".out")
    err_path = os.path.join(ARGS.workdir, ".err")
    rss_path = os.path.join(ARGS.workdir, ".rss")
    if poll_mem:
        cmd_run = ["/usr/bin/time", "-f", "%M", "-o", rss_path, *cmd]
    else:
        cmd_run = cmd
    with open(out_path, "w") as fo, open(err_path, "w") as fe:
        p = subprocess.Popen(cmd_run, stdout=fo, stderr=fe)
        peak_anon, target = 0, None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if poll_mem:
                target = target or child_of(p.pid)
                m = proc_mem(target) if target else None
                if m:
                    peak_anon = max(peak_anon, m[0])
            time.sleep(0.005 if poll_mem else 0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
    out, err = open(out_path).read(), open(err_path).read()
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{err}{out}")
    rss = 0
    if poll_mem:
        with open(rss_path) as f:
            rss = int(f.read().split()[-1]) * 1024
    return out, err, rss, peak_anon


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"bench: no JSON in output:\n{text}")


def best_of(cmd, key, poll_mem=False):
    runs = []
    for _ in range(ARGS.repeat):
        out, err, rss, anon = run(cmd, poll_mem)
        j = last_json(out)
        j["peak_rss_bytes"], j["peak_anon_bytes"] = rss, anon
        runs.append(j)
    best = max(runs, key=lambda j: j[key])
    best["runs"] = [j[key] for j in runs]
    # memory: the worst run counts
    best["peak_rss_bytes"] = max(j["peak_rss_bytes"] for j in runs)
    best["peak_anon_bytes"] = max(j["peak_anon_bytes"] for j in runs)
    return best


def make_npy(path, rows, dims):
    want = rows * 1
    for d in dims:
        want *= d
    if not ARGS.regen and os.path.exists(path) and want <= os.path.getsize(path) <= want + 4096:
        return
    print(f"bench: writing {path} ({rows} x {'x'.join(map(str, dims))} uint8, "
          f"{want / MIB:.0f} MiB)", flush=True)
    subprocess.run([PYTHON, os.path.join(SHARED, "make_npy.py"), path, str(rows),
                    *map(str, dims)], check=True)


def warm(path):
    with open(path, "rb") as f:
        while f.read(16 * MIB):
            pass


def stoke_cmd(spec, batch, workers, prefetch, extra=()):
    return [STOKE, "load", spec, "--batch-size", str(batch), "--workers", str(workers),
            "--prefetch", str(prefetch), "--shuffle", "--json", *extra]


def torch_cmd(path, batch, workers):
    return [PYTHON, os.path.join(SHARED, "torch_loader.py"), path, "--batch-size", str(batch),
            "--workers", str(workers), "--shuffle"]


def mem_entry(name, j, batch_bytes, workers, prefetch, base):
    batches = (prefetch * workers + 2) * batch_bytes
    bound = batches + 8 * MIB
    rss = j["peak_rss_bytes"] - base["peak_rss_bytes"]
    anon = j["peak_anon_bytes"] - base["peak_anon_bytes"]
    return {"run": name, "batch_bytes": batch_bytes, "bound_batches_bytes": batches,
            "bound_bytes": bound, "peak_rss_bytes": j["peak_rss_bytes"],
            "peak_anon_bytes": j["peak_anon_bytes"], "rss_over_baseline_bytes": rss,
            "anon_over_baseline_bytes": anon,
            "loader_buffers": j.get("buffers"), "loader_buffer_bytes": j.get("buffer_bytes"),
            "rss_within_bound": rss <= bound, "anon_within_bound": anon <= bound}


def main():
    global ARGS, STOKE
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="build directory holding ./stoke and bench/stoke_memcpy_bw")
    p.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                     "stoke-bench"))
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--big-rows", type=int, default=5000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--regen", action="store_true")
    p.add_argument("--out")
    ARGS = p.parse_args()
    STOKE = os.path.join(ARGS.build, "stoke")
    memcpy_bw = os.path.join(ARGS.build, "bench", "stoke_memcpy_bw")
    for exe in (STOKE, memcpy_bw):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench: {exe} not found: build first (cmake --build {ARGS.build})")
    os.makedirs(ARGS.workdir, exist_ok=True)
    out_json = ARGS.out or os.path.join(ARGS.workdir, "bench_results.json")

    small = os.path.join(ARGS.workdir, f"cifar_{ARGS.rows}.npy")
    big = os.path.join(ARGS.workdir, f"img224_{ARGS.big_rows}.npy")
    make_npy(small, ARGS.rows, (3, 32, 32))
    make_npy(big, ARGS.big_rows, (3, 224, 224))
    warm(small)
    warm(big)

    res = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
           "repeat": ARGS.repeat, "commands": {}}

    # --- case 1: 100k x 3x32x32, batch 256, shuffle ------------------------------------------
    cmd = stoke_cmd("npy:" + small, 256, 2, 2)
    res["commands"]["stoke_cifar"] = " ".join(cmd)
    print("bench: stoke, 3x32x32 ...", flush=True)
    s1 = best_of(cmd, "samples_per_s", poll_mem=True)
    torch = {}
    for w in (0, 2):
        tc = torch_cmd(small, 256, w)
        res["commands"][f"torch_cifar_w{w}"] = " ".join(tc)
        print(f"bench: torch, 3x32x32, {w} workers ...", flush=True)
        torch[w] = best_of(tc, "samples_per_s")
    tbest_w = max(torch, key=lambda w: torch[w]["samples_per_s"])
    expect_sum = ARGS.rows * (ARGS.rows - 1) // 2
    ratio1 = s1["samples_per_s"] / torch[tbest_w]["samples_per_s"]
    res["cifar"] = {"rows": ARGS.rows, "sample_bytes": 3072, "batch_size": 256, "stoke": s1,
                    "torch_w0": torch[0], "torch_w2": torch[2], "torch_best_workers": tbest_w,
                    "ratio_vs_torch_best": ratio1, "target_ratio": 10.0,
                    "index_sums_agree": s1["index_sum"] == torch[0]["index_sum"]
                    == torch[2]["index_sum"] == expect_sum}

    # --- case 2: 3x224x224, batch 64, shuffle, vs memcpy ---------------------------------------
    print("bench: memcpy bandwidth ...", flush=True)
    mc = last_json(run([memcpy_bw, "256", "5"])[0])
    res["commands"]["memcpy"] = f"{memcpy_bw} 256 5"
    cmd = stoke_cmd("npy:" + big, 64, 2, 2, ("--no-hash",))
    res["commands"]["stoke_imagenet"] = " ".join(cmd)
    print("bench: stoke, 3x224x224 ...", flush=True)
    s2 = best_of(cmd, "bytes_per_s", poll_mem=True)
    cmd = stoke_cmd("npy:" + big + ",io=pread", 64, 2, 2, ("--no-hash",))
    res["commands"]["stoke_imagenet_pread"] = " ".join(cmd)
    print("bench: stoke, 3x224x224, io=pread ...", flush=True)
    s2p = best_of(cmd, "bytes_per_s", poll_mem=True)
    row = 3 * 224 * 224
    res["imagenet"] = {"rows": ARGS.big_rows, "sample_bytes": row, "batch_size": 64,
                       "memcpy_bytes_per_s": mc["bytes_per_s"], "stoke": s2, "stoke_pread": s2p,
                       "ratio_vs_memcpy": s2["bytes_per_s"] / mc["bytes_per_s"],
                       "ratio_vs_memcpy_pread": s2p["bytes_per_s"] / mc["bytes_per_s"],
                       "target_ratio": 0.5}

    # --- memory -------------------------------------------------------------------------------
    # The process's own baseline (libraries, and the accelerator probes: on a machine with PoCL
    # the OpenCL probe alone maps tens of MiB): one sample, one batch, no workers.
    cmd = [STOKE, "load", "synthetic:1", "--batch-size", "1", "--workers", "0", "--json"]
    res["commands"]["stoke_baseline"] = " ".join(cmd)
    base = best_of(cmd, "samples_per_s", poll_mem=True)
    res["baseline"] = {"peak_rss_bytes": base["peak_rss_bytes"],
                       "peak_anon_bytes": base["peak_anon_bytes"]}
    res["memory"] = [mem_entry("cifar (mmap)", s1, 256 * 3072, 2, 2, base),
                     mem_entry("224 (mmap)", s2, 64 * row, 2, 2, base),
                     mem_entry("224 (pread)", s2p, 64 * row, 2, 2, base)]

    with open(out_json, "w") as f:
        json.dump(res, f, indent=2)

    # --- table --------------------------------------------------------------------------------
    c = res["cifar"]
    print()
    print(f"{ARGS.rows} x 3x32x32 uint8, batch 256, shuffle (best of {ARGS.repeat})")
    print(f"  {'loader':<28}{'samples/s':>14}{'MB/s':>10}")
    for name, j in (("stoke, 2 workers", s1), ("torch, 0 workers", torch[0]),
                    ("torch, 2 workers", torch[2])):
        print(f"  {name:<28}{j['samples_per_s']:>14,.0f}{j['bytes_per_s'] / 1e6:>10,.0f}")
    print(f"  stoke / torch best ({tbest_w} workers): {ratio1:.1f}x   (target >= 10x)   "
          f"index sums agree: {c['index_sums_agree']}")
    i = res["imagenet"]
    print()
    print(f"{ARGS.big_rows} x 3x224x224 uint8, batch 64, shuffle, 2 workers")
    print(f"  single-thread memcpy          {mc['bytes_per_s'] / 1e9:8.2f} GB/s")
    print(f"  stoke (io=mmap)               {s2['bytes_per_s'] / 1e9:8.2f} GB/s   "
          f"{100 * i['ratio_vs_memcpy']:.0f}% of memcpy   (target >= 50%)")
    print(f"  stoke (io=pread)              {s2p['bytes_per_s'] / 1e9:8.2f} GB/s   "
          f"{100 * i['ratio_vs_memcpy_pread']:.0f}% of memcpy")
    print()
    print("peak memory of the stoke process over its baseline (peak RSS %.1f MiB, anon+shm "
          "%.1f MiB:" % (base["peak_rss_bytes"] / MIB, base["peak_anon_bytes"] / MIB))
    print("`stoke load synthetic:1 --batch-size 1 --workers 0`); bound: (prefetch 2 x workers 2"
          " + 2) batches + 8 MiB")
    print(f"  {'run':<16}{'batch MiB':>10}{'bound MiB':>11}{'RSS +MiB':>10}{'anon +MiB':>11}"
          f"{'buffers':>9}")
    for m in res["memory"]:
        print(f"  {m['run']:<16}{m['batch_bytes'] / MIB:>10.1f}{m['bound_bytes'] / MIB:>11.1f}"
              f"{m['rss_over_baseline_bytes'] / MIB:>10.1f}"
              f"{m['anon_over_baseline_bytes'] / MIB:>11.1f}{str(m['loader_buffers']):>9}")
    print("  (RSS with io=mmap includes the touched pages of the mapped file: shared, clean page"
          " cache)")
    print()
    print(f"JSON: {out_json}")


if __name__ == "__main__":
    main()
