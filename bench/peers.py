#!/usr/bin/python3
"""stoke against its strongest peers, in one run, on the same files (issue 9).

    /usr/bin/python3 bench/peers.py [--build build] [--workdir /tmp/stoke-bench] [--repeat 3]
                                    [--quick] [--only CASE,...] [--out FILE]

Peers, each run as its own process that times only its loop and prints one JSON line:
  c1, c2      bench_tool gather: the same rows in the same order as stoke (stoke's sampler,
              RANDOM keyed by seed 0, epoch 0) memcpy'd into a batch buffer by 1 and 2 threads
              from the file mapped with MAP_POPULATE; the order is computed before the clock.
  np_take     bench/peer_numpy.py: np.take(arr, idx, axis=0, out=buf) per batch, same order.
  np_fancy    bench/peer_numpy.py: arr[idx] per batch, same order.
  torch_*     bench/peer_torch.py: DataLoader per sample (the default) and batched
              (BatchSampler(RandomSampler) as sampler, batch_size=None), 0 and 2 workers.
  stoke_w*    stoke load npy:FILE --batch-size B --workers W --shuffle --json --no-hash, W = 0, 2
              and auto when `stoke load --help` offers it.
Cases (warm: files read into the page cache before every run, for every peer alike; a host may
reclaim page cache on its own, and a file warmed once per case was seen here to fall below
io=auto's 99% resident rule within a minute, after which stoke read it with io_uring while
the C gather's MAP_POPULATE read the missing pages in before its clock): u8_3k (3x32x32 uint8, batch 256), u8_150k
(3x224x224 uint8, batch 64), f32_256 (1,000,000 x 64 float32, batch 1024), labels (3x32x32 +
int64 labels, batch 256), batch1 (3x32x32, batch 1, a prefix of the epoch); busy (one
`bench_tool spin` process hogging a core: stoke with its default workers vs the single-threaded
np_take loop); cold (the 3x32x32 file evicted with posix_fadvise(DONTNEED) before every run:
stoke with each io mode its --help lists, against the random 4 KiB read rate and the sequential
read rate that bench_tool measures on the same file, also evicted first; block shuffle vs the
sequential rate when --help offers --shuffle=block: a whole epoch, since the first rows of a
window of blocks are spread over all of its blocks, so a cut epoch reads far more than it
delivers; the first-samples run is reported too.  The block target is the run with direct=on,
the O_DIRECT block reads direct=auto picks for a file over half of RAM, which a cold file
stands for; the default run, through the page cache, is reported beside it).

Every peer runs --repeat times, the order of the peers reversed on every other round
(alternating), and the best run counts.  Ratios against the targets of issue 9 are printed and,
with every figure, command and run, written to --out (default WORKDIR/peers_results.json).  A
peer that is missing (no NumPy, no PyTorch, an option this stoke does not offer) is reported as
"n/a (...)"; a peer that fails is reported with its error; neither stops the benchmark.
--quick runs everything on tiny files, once, to test the script (its figures mean nothing).
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "bench")
MIB = 1 << 20

FULL = {"rows": 100000, "big_rows": 5000, "f32_rows": 1000000, "batch1_samples": 50000,
        "cold_samples": 20480, "randread_count": 20000}
QUICK = {"rows": 4000, "big_rows": 200, "f32_rows": 20000, "batch1_samples": 2000,
         "cold_samples": 1024, "randread_count": 1000}
TARGETS = {"vs_c2": 0.8, "vs_peer": 1.5, "busy": 1.2, "cold_random": 0.7, "cold_block_seq": 0.7}


# --- running things -------------------------------------------------------------------------------

def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def run_json(cmd, timeout=900):
    """Runs cmd; returns (json, None) or (None, error text).  Never raises for a failing peer."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    except OSError as e:
        return None, str(e)
    j = last_json(p.stdout)
    if p.returncode != 0 or j is None or j.get("ok") is False:
        msg = (j or {}).get("error") or (p.stderr.strip() or p.stdout.strip())[-400:]
        return None, f"exit {p.returncode}: {msg}"
    return j, None


def python_has(module):
    r = subprocess.run([ARGS.python, "-c", f"import {module}"], capture_output=True, text=True)
    return r.returncode == 0


def stoke_features():
    """What this stoke's `load --help` offers: workers auto, block shuffle, io modes."""
    r = subprocess.run([STOKE, "load", "--help"], capture_output=True, text=True)
    text = r.stdout + r.stderr

    def entry(opt):  # the help text of one option: its line and the indented lines below it
        m = re.search(r"^\s*" + re.escape(opt) + r"\b.*(?:\n\s{20,}.*)*", text, re.M)
        return m.group(0) if m else ""

    modes = set()
    for m in re.finditer(r"io=([a-z_|]+)", text):
        modes.update(x for x in m.group(1).split("|") if x)
    return {"workers_auto": "auto" in entry("--workers"),
            "shuffle_block": "block" in entry("--shuffle"),
            "io_modes": sorted(modes), "direct": "direct=" in text, "help": text}


# --- files --------------------------------------------------------------------------------------

def npy_header(dtype, shape):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        dtype, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    pad = 64 - (10 + len(d) + 1) % 64
    return b"\x93NUMPY\x01\x00" + (len(d) + pad + 1).to_bytes(2, "little") + \
        (d + " " * pad + "\n").encode()


def write_npy_plain(path, dtype, shape, kind):
    """Writes a reproducible .npy without NumPy: random bytes (kind "u8"), finite float32 in
    [0.5, 2) (kind "f32": every 4th byte, the high one, forced to 0x3f), or labels i % 10."""
    rng = random.Random(0)
    n = 1
    for s in shape:
        n *= s
    item = {"u8": 1, "f32": 4, "labels": 8}[kind]
    with open(path + ".tmp", "wb") as f:
        f.write(npy_header(dtype, shape))
        done, chunk = 0, 16 * MIB
        while done < n:
            k = min(chunk, n - done)
            if kind == "labels":
                buf = b"".join((i % 10).to_bytes(8, "little") for i in range(done, done + k))
            else:
                buf = bytearray(rng.randbytes(k * item))
                if kind == "f32":
                    buf[3::4] = b"\x3f" * k
            f.write(buf)
            done += k
    os.replace(path + ".tmp", path)


def make_file(path, kind, shape):
    dtype = {"u8": "|u1", "f32": "<f4", "labels": "<i8"}[kind]
    want = len(npy_header(dtype, shape))
    item = {"u8": 1, "f32": 4, "labels": 8}[kind]
    want += item * math.prod(shape)
    if os.path.exists(path) and os.path.getsize(path) == want:
        return
    print(f"bench: writing {path} ({'x'.join(map(str, shape))} {dtype}, {want / MIB:.0f} MiB)",
          flush=True)
    if HAVE["numpy"] and kind == "u8":
        subprocess.run([ARGS.python, os.path.join(SHARED, "make_npy.py"), path,
                        *map(str, shape)], check=True)
    elif HAVE["numpy"]:
        code = ("import numpy as np, sys; n = int(sys.argv[2]); rng = np.random.default_rng(0)\n"
                "a = rng.random((n, 64), dtype=np.float32) if sys.argv[3] == 'f32' "
                "else (np.arange(n, dtype=np.int64) % 10)\nnp.save(sys.argv[1], a)")
        subprocess.run([ARGS.python, "-c", code, path, str(shape[0]), kind], check=True)
    else:
        write_npy_plain(path, dtype, shape, kind)


def warm(*paths):
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 * MIB):
                pass


# --- peers --------------------------------------------------------------------------------------

def peer(name, cmd, note=None):
    return {"name": name, "cmd": cmd, "na": note}


def warm_peers(case):
    """The peers of one warm case, in their running order."""
    f, b, lab, lim = case["file"], case["batch"], case.get("labels"), case.get("limit", 0)
    out = []
    for t in (1, 2):
        cmd = [TOOL, "gather", f, "--batch", str(b), "--threads", str(t)]
        out.append(peer(f"c{t}", cmd + (["--labels", lab] if lab else []) +
                        (["--limit", str(lim)] if lim else [])))
    for mode in ("take", "fancy"):
        cmd = [ARGS.python, os.path.join(HERE, "peer_numpy.py"), f, case["order"],
               "--batch-size", str(b), "--mode", mode]
        out.append(peer(f"np_{mode}", cmd + (["--labels", lab] if lab else []) +
                        (["--limit", str(lim)] if lim else []),
                        None if HAVE["numpy"] else "n/a (numpy not installed)"))
    for mode in ("sample", "batched"):
        for w in (0, 2):
            cmd = [ARGS.python, os.path.join(HERE, "peer_torch.py"), f, "--batch-size", str(b),
                   "--workers", str(w), "--mode", mode]
            out.append(peer(f"torch_{mode}_w{w}", cmd + (["--labels", lab] if lab else []) +
                            (["--limit", str(lim)] if lim else []),
                            None if HAVE["torch"] else "n/a (torch not installed)"))
    for w in ("0", "2", "auto"):
        out.append(stoke_peer(f"stoke_w{w}", f, b, w, lab, lim))
    return out


def stoke_peer(name, path, batch, workers, labels=None, limit=0, io=None, shuffle="--shuffle",
               direct=None):
    spec = "npy:" + path + (",labels=" + labels if labels else "") + (",io=" + io if io else "")
    spec += ",direct=" + direct if direct else ""
    cmd = [STOKE, "load", spec, "--batch-size", str(batch), shuffle, "--json", "--no-hash"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if limit:
        cmd += ["--limit", str(max(1, limit // batch))]
    na = None
    if workers == "auto" and not FEAT["workers_auto"]:
        na = "n/a (not supported by this build)"
    if io and io not in FEAT["io_modes"]:
        na = "n/a (not supported by this build)"
    if shuffle != "--shuffle" and not FEAT["shuffle_block"]:
        na = "n/a (not supported by this build)"
    if direct and not FEAT["direct"]:
        na = "n/a (not supported by this build)"
    return peer(name, cmd, na)


def run_peers(peers, before=None, after=None):
    """Alternating rounds (reversed order on odd rounds); best samples/s of each peer.  before
    and after (cold case) run around every run; what they return is kept in the run's JSON."""
    res = {p["name"]: {"cmd": " ".join(p["cmd"]), "runs": [], "errors": [], "na": p["na"]}
           for p in peers}
    live = [p for p in peers if not p["na"]]
    for rnd in range(ARGS.repeat):
        for p in (live if rnd % 2 == 0 else list(reversed(live))):
            extra = before(p) if before else None
            j, err = run_json(p["cmd"])
            r = res[p["name"]]
            if j is None:
                r["errors"].append(err)
                continue
            if extra:
                j["before"] = extra
            if after:
                j["after"] = after(p)
            r["runs"].append(j)
    for r in res.values():
        if r["runs"]:
            r["best"] = max(r["runs"], key=lambda j: j["samples_per_s"])
            r["samples_per_s"] = r["best"]["samples_per_s"]
            r["bytes_per_s"] = r["best"].get("bytes_per_s")
    return res


# --- report -------------------------------------------------------------------------------------

def fmt_rate(r):
    if r.get("na"):
        return r["na"]
    if "samples_per_s" not in r:
        err = r["errors"][-1] if r["errors"] else "?"
        return "failed: " + (err if len(err) < 110 else err[:30] + " ... " + err[-75:])
    runs = ", ".join(f"{j['samples_per_s']:,.0f}" for j in r["runs"])
    mb = r.get("bytes_per_s") or 0
    ios = sorted({j["io"] for j in r["runs"] if j.get("io")})  # stoke: what io=auto chose
    io = f"   io: {'/'.join(ios)}" if ios else ""
    return f"{r['samples_per_s']:>14,.0f} {mb / 1e6:>10,.0f}   runs: {runs}{io}"


def ratio(num, den, target, what):
    if not num or not den:
        return {"what": what, "ratio": None, "target": target, "met": None}
    q = num / den
    return {"what": what, "ratio": q, "target": target,
            "met": None if target is None else q >= target}


def fmt_ratio(r):
    if r["ratio"] is None:
        return f"  {r['what']}: n/a (a figure is missing)"
    if r["target"] is None:
        return f"  {r['what']}: {r['ratio']:.2f}x"
    met = "met" if r["met"] else "NOT met"
    return f"  {r['what']}: {r['ratio']:.2f}x   (target >= {r['target']}x: {met})"


def best_of(res, prefix):
    got = [(n, r) for n, r in res.items() if n.startswith(prefix) and "samples_per_s" in r]
    return max(got, key=lambda x: x[1]["samples_per_s"]) if got else (None, None)


def rate(r):
    return r["samples_per_s"] if r else None


def print_table(title, res):
    print(f"\n{title}")
    print(f"  {'peer':<22}{'samples/s':>14} {'MB/s':>10}")
    for n, r in res.items():
        print(f"  {n:<22}{fmt_rate(r)}")


def same_rows(res, expect_sum):
    """Peers in stoke's order must agree on index_sum and order_hash; torch (its own order)
    only on the sum of a whole epoch."""
    sums, hashes = set(), set()
    for n, r in res.items():
        b = r.get("best")
        if not b:
            continue
        if n.startswith("torch"):
            if expect_sum is not None and b["index_sum"] != expect_sum:
                return False
            continue
        sums.add(b.get("index_sum"))
        if b.get("order_hash"):
            hashes.add(b["order_hash"])
    return len(sums) <= 1 and len(hashes) <= 1


# --- cases --------------------------------------------------------------------------------------

def warm_case(case):
    files = [p for p in (case["file"], case.get("labels")) if p]
    res = run_peers(warm_peers(case), before=lambda p: warm(*files))
    sname, s = best_of(res, "stoke")
    _, c2 = best_of(res, "c2")
    pname, pbest = None, None
    for prefix in ("np_", "torch_"):
        n, r = best_of(res, prefix)
        if r and (pbest is None or r["samples_per_s"] > pbest["samples_per_s"]):
            pname, pbest = n, r
    lim = case.get("limit", 0)
    rows = case["rows"]
    ratios = [ratio(rate(s), rate(c2), TARGETS["vs_c2"], f"stoke ({sname}) / C gather 2 threads"),
              ratio(rate(s), rate(pbest), TARGETS["vs_peer"],
                    f"stoke ({sname}) / best NumPy-or-PyTorch peer ({pname or 'none ran'})")]
    if case["batch"] == 1:
        wn, wr = None, None
        for n in ("stoke_w2", "stoke_wauto"):
            if "samples_per_s" in res[n] and (wr is None or rate(res[n]) > rate(wr)):
                wn, wr = n, res[n]
        ratios.append(ratio(rate(wr), res["stoke_w0"].get("samples_per_s"), 1.0,
                            f"stoke with workers ({wn}) / stoke_w0"))
    out = {"description": case["desc"], "file": case["file"], "batch_size": case["batch"],
           "samples": lim or rows, "peers": res, "ratios": ratios,
           "same_rows": same_rows(res, None if lim else rows * (rows - 1) // 2)}
    print_table(case["desc"], res)
    for r in ratios:
        print(fmt_ratio(r))
    print(f"  same rows in all peers (index_sum / order_hash): {out['same_rows']}")
    return out


def busy_case(case):
    warm(case["file"])
    hog = subprocess.Popen([TOOL, "spin"])
    try:
        time.sleep(0.2)
        peers = [stoke_peer("stoke_default_workers", case["file"], case["batch"], None),
                 stoke_peer("stoke_w0", case["file"], case["batch"], "0"),
                 peer("np_take", [ARGS.python, os.path.join(HERE, "peer_numpy.py"), case["file"],
                                  case["order"], "--batch-size", str(case["batch"])],
                      None if HAVE["numpy"] else "n/a (numpy not installed)")]
        res = run_peers(peers, before=lambda p: warm(case["file"]))
    finally:
        hog.kill()
        hog.wait()
    r = ratio(res["stoke_default_workers"].get("samples_per_s"),
              res["np_take"].get("samples_per_s"), TARGETS["busy"],
              "stoke default workers / single-threaded np.take loop, one core hogged")
    default_w = (res["stoke_default_workers"].get("best") or {}).get("workers")
    print_table(case["desc"] + " -- one `bench_tool spin` hog running", res)
    print(f"  (stoke's default workers in this build: {default_w})")
    print(fmt_ratio(r))
    n = case["rows"]
    same = same_rows(res, n * (n - 1) // 2)
    print(f"  same rows in all peers (index_sum / order_hash): {same}")
    return {"description": case["desc"], "peers": res, "ratios": [r],
            "stoke_default_workers": default_w, "same_rows": same}


def evict(path):
    j, err = run_json([TOOL, "evict", path])
    return j or {"error": err}


def limits(path, n):
    """Random 4 KiB and sequential read rates of the evicted file, best of --repeat."""
    rr, sq = [], []
    for _ in range(ARGS.repeat):
        ev = evict(path)
        j, err = run_json([TOOL, "randread", path, "--size", "4096", "--count", str(n)])
        rr.append(j or {"error": err, "evict": ev})
        ev = evict(path)
        j, err = run_json([TOOL, "seqread", path])
        sq.append(j or {"error": err, "evict": ev})
    best_r = max((j for j in rr if "reads_per_s" in j), key=lambda j: j["reads_per_s"],
                 default=None)
    best_s = max((j for j in sq if "bytes_per_s" in j), key=lambda j: j["bytes_per_s"],
                 default=None)
    return {"randread": best_r, "randread_runs": rr, "seqread": best_s, "seqread_runs": sq}


def cold_case(case):
    f, b, lim = case["file"], case["batch"], case["limit"]
    lim_res = limits(f, P["randread_count"])
    peers = [stoke_peer(f"stoke_w{w}", f, b, w, limit=lim) for w in ("0", "2", "auto")]
    for io in ("mmap", "pread", "uring", "auto"):
        peers.append(stoke_peer(f"stoke_io_{io}", f, b, None, limit=lim, io=io))
    # Block shuffle: a whole epoch (every window of blocks read whole), and, for reference, the
    # first samples like the other peers (a part of the first window: its rows come from every
    # block of the window, so nearly the whole window has to be read to deliver them).
    peers.append(stoke_peer("stoke_block", f, b, None, shuffle="--shuffle=block"))
    # ... with O_DIRECT block reads: what direct=auto picks for a file over half of RAM, the
    # case a cold epoch stands for (this file is smaller, so it is asked for by name).
    peers.append(stoke_peer("stoke_block_direct", f, b, None, shuffle="--shuffle=block",
                            direct="on"))
    peers.append(stoke_peer("stoke_block_first", f, b, None, limit=lim,
                            shuffle="--shuffle=block"))
    # ... and the whole epoch on the file in the page cache: what the cold one can approach.
    peers.append(stoke_peer("stoke_block_warm", f, b, None, shuffle="--shuffle=block"))

    def before(p):
        if p["name"] == "stoke_block_warm":
            warm(f)
            return None
        return evict(f)
    res = run_peers(peers, before=before, after=lambda p: evict(f))
    resid = [j["before"].get("resident_after") for r in res.values() for j in r["runs"]
             if "before" in j]
    resid = [x for x in resid if x is not None]
    cold_ok = bool(resid) and max(resid) < 0.05
    rr, sq = lim_res["randread"], lim_res["seqread"]
    shuffled = {n: r for n, r in res.items() if not n.startswith("stoke_block")}
    warm_blk = res["stoke_block_warm"].get("bytes_per_s")
    sname, s = best_of(shuffled, "stoke")
    blk = res["stoke_block"] if "samples_per_s" in res["stoke_block"] else None
    dblk = res["stoke_block_direct"] if "samples_per_s" in res["stoke_block_direct"] else None
    ratios = [ratio(rate(s), rr and rr["reads_per_s"], TARGETS["cold_random"],
                    f"stoke shuffled ({sname}) rows/s / random 4 KiB reads/s"),
              ratio(dblk and dblk["bytes_per_s"], sq and sq["bytes_per_s"],
                    TARGETS["cold_block_seq"],
                    "stoke block shuffle (whole epoch, O_DIRECT blocks: a file over half of "
                    "RAM) bytes/s / sequential read")]
    ratio_cached = ratio(blk and blk["bytes_per_s"], sq and sq["bytes_per_s"], None,
                         "for reference, block shuffle through the page cache (direct=auto on "
                         "this file) bytes/s / sequential read")
    print_table(case["desc"] + " -- file evicted before every run", res)
    if rr:
        print(f"  limit: random 4 KiB reads {rr['reads_per_s']:,.0f}/s ({rr['method']}, "
              f"{'O_DIRECT' if rr['direct'] else 'buffered'}, threads {rr['threads']}, "
              f"depth {rr['depth']}, {rr['reads']} reads)")
        if rr["method"] != "io_uring":
            print("  (threads of pread, not io_uring: bench_tool was built without liburing-dev, or"
                  " the kernel refused a ring; on a 2-core machine this understates the device's"
                  " random-read limit)")
    else:
        print(f"  limit: random reads failed: {lim_res['randread_runs'][-1]}")
    if sq:
        print(f"  limit: sequential read {sq['bytes_per_s'] / 1e6:,.0f} MB/s "
              f"({sq['bytes'] / MIB:.0f} MiB, {sq['block'] // 1024} KiB reads)")
    read = {n: r["best"]["after"].get("resident_before") for n, r in res.items()
            if r.get("best") and "after" in r["best"]}
    if read:
        print("  fraction of the file in the page cache after the best run (what it read, "
              "read-ahead included): " + ", ".join(f"{n} {x:.0%}" for n, x in read.items()
                                                   if x is not None))
    if not cold_ok:
        print(f"  WARNING: the file stayed in the page cache after eviction (resident fractions "
              f"{resid}): these are not cold figures")
    if blk and warm_blk:
        print(f"  block shuffle, whole epoch: cold {blk['bytes_per_s'] / 1e6:,.0f} MB/s, warm "
              f"(file in the page cache) {warm_blk / 1e6:,.0f} MB/s: cold / warm "
              f"{blk['bytes_per_s'] / warm_blk:.2f}x")
    bufs = {n: r["best"].get("block_buffers") for n, r in res.items()
            if n.startswith("stoke_block") and r.get("best")}
    if any(bufs.values()):
        print("  block buffers in the best run (blocks read whole / with O_DIRECT / rows from "
              "buffers): " + ", ".join(f"{n} {v['blocks']}/{v['direct']}/{v['rows']}"
                                       for n, v in bufs.items() if v))
    for r in ratios:
        print(fmt_ratio(r))
    print(fmt_ratio(ratio_cached))
    return {"description": case["desc"], "samples": lim, "limits": lim_res, "peers": res,
            "ratios": ratios, "ratio_block_cached": ratio_cached, "evicted": cold_ok,
            "resident_after_evict": resid, "file_fraction_read": read}


# --- main ---------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="build directory holding ./stoke and bench/bench_tool")
    p.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                     "stoke-bench"))
    p.add_argument("--repeat", type=int, help="runs per peer (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny files, one run: tests the script")
    p.add_argument("--only", help="comma-separated cases: u8_3k,u8_150k,f32_256,labels,batch1,"
                                  "busy,cold")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter of the peers")
    p.add_argument("--out")
    a = p.parse_args()
    if a.repeat is None:
        a.repeat = 1 if a.quick else 3
    return a


def make_cases():
    w = ARGS.workdir
    n, big, nf = P["rows"], P["big_rows"], P["f32_rows"]
    files = {"u8_3k": (os.path.join(w, f"cifar_{n}.npy"), "u8", (n, 3, 32, 32)),
             "u8_150k": (os.path.join(w, f"img224_{big}.npy"), "u8", (big, 3, 224, 224)),
             "f32": (os.path.join(w, f"f32x64_{nf}.npy"), "f32", (nf, 64)),
             "labels": (os.path.join(w, f"labels_{n}.npy"), "labels", (n,))}
    for path, kind, shape in files.values():
        make_file(path, kind, shape)
    orders = {}
    for key, rows in (("u8_3k", n), ("u8_150k", big), ("f32", nf)):
        orders[key] = os.path.join(w, f"order_{rows}_s0_e0.bin")
        j, err = run_json([TOOL, "order", str(rows), orders[key]])
        if j is None:
            sys.exit(f"bench: bench_tool order failed: {err}")
    c, i, f = files["u8_3k"][0], files["u8_150k"][0], files["f32"][0]
    lab = files["labels"][0]
    return [
        ("u8_3k", warm_case, {"desc": f"{n} x 3x32x32 uint8 (3 KB rows), batch 256, shuffle",
                              "file": c, "order": orders["u8_3k"], "batch": 256, "rows": n}),
        ("u8_150k", warm_case, {"desc": f"{big} x 3x224x224 uint8 (150 KB rows), batch 64, shuffle",
                                "file": i, "order": orders["u8_150k"], "batch": 64, "rows": big}),
        ("f32_256", warm_case, {"desc": f"{nf} x 64 float32 (256-byte rows), batch 1024, shuffle",
                                "file": f, "order": orders["f32"], "batch": 1024, "rows": nf}),
        ("labels", warm_case, {"desc": f"{n} x 3x32x32 uint8 + int64 labels, batch 256, shuffle",
                               "file": c, "labels": lab, "order": orders["u8_3k"], "batch": 256,
                               "rows": n}),
        ("batch1", warm_case, {"desc": f"3x32x32 uint8, batch 1, shuffle, first "
                                       f"{P['batch1_samples']} samples", "file": c,
                               "order": orders["u8_3k"], "batch": 1, "rows": n,
                               "limit": P["batch1_samples"]}),
        ("busy", busy_case, {"desc": f"{n} x 3x32x32 uint8, batch 256, shuffle", "file": c,
                             "order": orders["u8_3k"], "batch": 256, "rows": n}),
        ("cold", cold_case, {"desc": f"3x32x32 uint8 (3 KB rows), batch 256, shuffle, first "
                                     f"{P['cold_samples']} samples", "file": c, "batch": 256,
                             "limit": P["cold_samples"]}),
    ]


def main():
    global ARGS, STOKE, TOOL, HAVE, FEAT, P
    ARGS = parse_args()
    P = QUICK if ARGS.quick else FULL
    STOKE = os.path.join(ARGS.build, "stoke")
    TOOL = os.path.join(ARGS.build, "bench", "bench_tool")
    for exe in (STOKE, TOOL):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench: {exe} not found: build first (cmake --build {ARGS.build} -j2 "
                     f"--target stoke_cli stoke_bench_tool)")
    os.makedirs(ARGS.workdir, exist_ok=True)
    HAVE = {"numpy": python_has("numpy"), "torch": python_has("torch")}
    FEAT = stoke_features()
    print(f"bench: python {ARGS.python}: numpy {'yes' if HAVE['numpy'] else 'NO'}, torch "
          f"{'yes' if HAVE['torch'] else 'NO'}; stoke: workers auto {FEAT['workers_auto']}, "
          f"block shuffle {FEAT['shuffle_block']}, io modes {FEAT['io_modes']}; "
          f"repeat {ARGS.repeat}{', QUICK (figures mean nothing)' if ARGS.quick else ''}",
          flush=True)
    only = set(ARGS.only.split(",")) if ARGS.only else None
    known = {"u8_3k", "u8_150k", "f32_256", "labels", "batch1", "busy", "cold"}
    if only and only - known:
        sys.exit(f"bench: unknown case(s) {sorted(only - known)}; cases: {sorted(known)}")
    git = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    version = subprocess.run([STOKE, "version"], capture_output=True, text=True).stdout.strip()
    res = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
           "commit": git or None, "stoke_version": version or None, "build": ARGS.build,
           "quick": ARGS.quick, "repeat": ARGS.repeat, "python": ARGS.python, "have": HAVE,
           "stoke_features": {k: v for k, v in FEAT.items() if k != "help"},
           "targets": TARGETS, "sizes": P, "cases": {}}
    t0 = time.time()
    for name, fn, case in make_cases():
        if only and name not in only:
            continue
        print(f"\nbench: case {name} ...", flush=True)
        tc = time.time()
        res["cases"][name] = fn(case)
        res["cases"][name]["wall_s"] = time.time() - tc
        print(f"  ({res['cases'][name]['wall_s']:.0f} s)", flush=True)
    res["seconds"] = time.time() - t0
    out = ARGS.out or os.path.join(ARGS.workdir, "peers_results.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print("\nsummary (targets of issue 9):")
    for name, c in res["cases"].items():
        for r in c["ratios"]:
            state = "n/a" if r["met"] is None else ("met" if r["met"] else "NOT met")
            q = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            print(f"  {name:<9}{r['what']:<70}{q:>8}  {state}")
    print(f"\nJSON: {out}   ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
