#!/usr/bin/env python3
"""Where a drop-in loader's peak memory goes: one epoch of bench_dropin.py's fakedata or
imagefolder case (batch 64, shuffled) in a fresh process, whose process tree's /proc/PID/smaps
is read every --interval seconds; the sample with the largest total PSS is printed by process
(the caller, then its descendants: stoke's zygote and workers, torch's workers) and by mapping
kind:

  anon       anonymous memory and [heap] (a forked child's share of the caller's heap included)
  blocks     stoke's shared batch blocks (memfd "stoke-batches", or the node-wide arena)
  torch_shm  torch's per-batch shared memory (/dev/shm/torch_*, deleted or not)
  libs       shared libraries (.so): their PSS depends on every process of the host mapping them
  file       other files (python's own, .pyc, fonts, ...)
  other      [stack], [vvar], ...

plus each process's private anonymous memory.  --keep holds each batch until the next arrives
(`for x, y in loader:`); without it the loop drops the batch first (bench_dropin's loop).

  /usr/bin/python3 bench/pss_breakdown.py --build build --side stoke [--case imagefolder]
      [--workers 2] [--keep] [--workdir /tmp/stoke_bench_dropin]

The case's data is bench_dropin.py's (the folder is made in --workdir when missing).  Reading
a torch process's smaps costs a few ms: the rates printed are not bench_dropin's."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

KINDS = ("anon", "blocks", "torch_shm", "libs", "file", "other")
N = {"fakedata": 640, "imagefolder": 800}


def kind(name):
    if "stoke-batches" in name or "stoke-arena" in name:
        return "blocks"
    if ".so" in name:
        return "libs"
    if "/torch_" in name or name.startswith("/dev/shm"):
        return "torch_shm"
    if name in ("", "[heap]"):
        return "anon"
    if name.startswith("["):
        return "other"
    return "file"


def smaps(pid):
    """({kind: PSS KiB}, private anonymous KiB) of one process; empty if it is gone."""
    out, priv, name = {}, 0, ""
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                p = line.split()
                if not p:
                    continue
                if not p[0].endswith(":"):  # a mapping's header: range perms offset dev inode name
                    name = " ".join(p[5:])
                elif p[0] == "Pss:":
                    k = kind(name)
                    out[k] = out.get(k, 0) + int(p[1])
                elif p[0] in ("Private_Clean:", "Private_Dirty:") and kind(name) == "anon":
                    priv += int(p[1])
    except OSError:
        pass
    return out, priv


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    s = f.read()
                kids.setdefault(int(s[s.rindex(")") + 2:].split()[1]), []).append(int(d))
            except (OSError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def child(a):
    import bench_dropin as bd
    if a.side == "stoke":
        from stoke import DataLoader
    else:
        from torch.utils.data import DataLoader
    ds = bd.make_dataset(a.case, N[a.case], a.folder)
    print("@start", flush=True)
    t0 = time.perf_counter()
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=a.workers, pin_memory=True)
    n = 0
    for b in loader:
        n += bd.checksum(a.case, bd.touch(b))[0]
        if not a.keep:
            del b
    dt = time.perf_counter() - t0
    print("@end", flush=True)
    sys.stdin.readline()
    print(json.dumps({"samples": n, "seconds": dt}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--side", choices=("stoke", "torch"), default="stoke")
    ap.add_argument("--case", choices=sorted(N), default="imagefolder")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "stoke_bench_dropin"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    if a.child:
        return child(a)
    folder = ""
    if a.case == "imagefolder":
        from bench_images import generate
        folder = os.path.join(a.workdir, "imagefolder%d" % N[a.case])
        generate(folder, N[a.case], 10, False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.abspath(a.build), "python"), here])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--side", a.side, "--case",
           a.case, "--workers", str(a.workers), "--folder", folder] + (["--keep"] * a.keep)
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    st = {"on": False, "stop": False, "peak": 0, "at": None, "n": 0}

    def take():
        per = {q: smaps(q) for q in [p.pid] + descendants(p.pid)}
        tot = sum(sum(v.values()) for v, _ in per.values())
        st["n"] += 1
        if tot > st["peak"]:
            st["peak"], st["at"] = tot, per

    def loop():
        while not st["stop"]:
            if st["on"]:
                take()
            time.sleep(a.interval)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    res = None
    for line in p.stdout:
        line = line.strip()
        if line == "@start":
            st["on"] = True
        elif line == "@end":
            st["on"] = False
            take()
            p.stdin.write("\n")
            p.stdin.flush()
        elif line.startswith("{"):
            res = json.loads(line)
    st["stop"] = True
    if p.wait() != 0 or res is None or st["at"] is None:
        sys.exit("the run failed (exit %d)" % p.returncode)
    mib = lambda k: "%9.1f" % (k / 1024)  # noqa: E731
    print("%s %s, %d workers%s: %.0f samples/s, peak PSS %.1f MiB (of %d samples)" % (
        a.side, a.case, a.workers, ", batch kept" if a.keep else "",
        res["samples"] / res["seconds"], st["peak"] / 1024, st["n"]))
    print("  %-8s %s %9s %12s" % ("process", " ".join("%9s" % k for k in KINDS), "total",
                                  "anon private"))
    agg = dict.fromkeys(KINDS, 0)
    for i, (v, priv) in enumerate(st["at"].values()):
        for k in KINDS:
            agg[k] += v.get(k, 0)
        print("  %-8s %s %s %12s" % ("caller" if i == 0 else "child %d" % i,
                                     " ".join(mib(v.get(k, 0)) for k in KINDS),
                                     mib(sum(v.values())), mib(priv).strip()))
    print("  %-8s %s %s" % ("all", " ".join(mib(agg[k]) for k in KINDS), mib(st["peak"])))


if __name__ == "__main__":
    main()
