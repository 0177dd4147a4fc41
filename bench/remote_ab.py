"""A/B of two stoke CLIs on bench_remote.py's shards, alternating, rounds x rows: behind nginx
`limit_rate` (mode=stream; the cache; range reads) and on loopback (the same three), with 16 parallel curls as
what the machine serves on 16 limited connections (row curl; curl8: 8 curls, 2 shards each on one
connection, as the cache's 8 download connections).  Each run a whole `stoke load` process;
connections and requests counted from nginx's access log; medians and ranges at the end.

    python3 bench/remote_ab.py --a BUILD_A/stoke --b BUILD_B/stoke [--rounds 3] [--rows ROW,...]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "remote"))
sys.path.insert(0, HERE)
import bench_remote as br  # noqa: E402
import servers  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--a", required=True)
ap.add_argument("--b", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--rows", default="curl,lim stream,lim cache,loop stream")
ap.add_argument("--workdir", default="/tmp/stoke_bench_remote")
args = ap.parse_args()
RATE = 20 * 1.048576  # MB/s of limit_rate 20m
data = os.path.join(args.workdir, "shards-16-400-40")
br.make_shards(data, 16, 400, 40 << 10)
total = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data) if f.endswith(".tar"))
tmp = tempfile.mkdtemp()
lp, up = os.path.join(tmp, "lim"), os.path.join(tmp, "un")
lim = servers.start_nginx(data, lp, extra="limit_rate 20m;")
un = servers.start_nginx(data, up)
clis = {"a": args.a, "b": args.b}
rows = [("lim stream", lim, lp, ",mode=stream", False), ("lim cache", lim, lp, "", True),
        ("loop stream", un, up, ",mode=stream", False), ("loop cache", un, up, "", True),
        ("loop range", un, up, "", False), ("lim range", lim, lp, "", False)]
want = args.rows.split(",")
res = {}
try:
    for rnd in range(args.rounds):
        if "curl8" in want:  # 8 connections, 2 shards each one after another: the cache's 8
            t = time.perf_counter()  # download connections' work, what the machine serves them
            ps = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-o", "/dev/null",
                                    lim.url("shard-%06d.tar" % i), lim.url("shard-%06d.tar" % (i + 8))])
                  for i in range(8)]
            for q in ps:
                q.wait()
            mbs = total / (time.perf_counter() - t) / 1e6
            res.setdefault(("curl x8", "-"), []).append((mbs, mbs / (8 * RATE), 8, 16))
            print("r%d curl x8 %7.1f MB/s ratio %.2f" % (rnd, mbs, mbs / (8 * RATE)), flush=True)
        if "curl" in want:
            t = time.perf_counter()
            ps = [subprocess.Popen(["curl", "-s", "-o", "/dev/null",
                                    lim.url("shard-%06d.tar" % i)]) for i in range(16)]
            for q in ps:
                q.wait()
            mbs = total / (time.perf_counter() - t) / 1e6
            res.setdefault(("curl x16", "-"), []).append((mbs, mbs / (16 * RATE), 16, 16))
            print("r%d curl x16 %7.1f MB/s ratio %.2f" % (rnd, mbs, mbs / (16 * RATE)), flush=True)
        for name, srv, prefix, mode, cache in rows:
            if name not in want:
                continue
            for who in ("a", "b") if rnd % 2 == 0 else ("b", "a"):
                env = dict(os.environ)
                env.pop("STOKE_CACHE_DIR", None)
                if cache:  # removed after the run: 272 MB each, and the default cap is what
                    env["STOKE_CACHE_DIR"] = tempfile.mkdtemp()  # leaves a tenth of the disk free
                open(os.path.join(prefix, "access.log"), "w").close()
                spec = "tar:" + srv.url("shard-{000000..000015}.tar") + mode
                t = time.perf_counter()
                p = subprocess.run([clis[who], "load", spec, "--workers", "2", "--batch-size", "64",
                                    "--no-hash", "--json"], env=env, capture_output=True, text=True)
                mbs = total / (time.perf_counter() - t) / 1e6
                if cache:
                    shutil.rmtree(env["STOKE_CACHE_DIR"])
                conns = br.connections(prefix)
                reqs = len(servers.access_log(prefix))
                ok = p.returncode == 0 and json.loads(p.stdout).get("samples") == 16 * 400
                res.setdefault((name, who), []).append((mbs, mbs / (conns * RATE), conns, reqs))
                print("r%d %-12s %s %7.1f MB/s conns %2d reqs %3d ratio %.2f ok=%s load %.1f" % (
                    rnd, name, who, mbs, conns, reqs, mbs / (conns * RATE), ok,
                    os.getloadavg()[0]), flush=True)
finally:
    lim.stop()
    un.stop()
    shutil.rmtree(tmp, ignore_errors=True)
print("--- medians (ranges)")
for (name, who), v in sorted(res.items()):
    m, r = [x[0] for x in v], [x[1] for x in v]
    print("%-12s %s MB/s %.1f (%.1f-%.1f) of conns x rate %.2f (%.2f-%.2f) conns %s reqs %s" % (
        name, who, statistics.median(m), min(m), max(m), statistics.median(r), min(r), max(r),
        sorted({x[2] for x in v}), sorted({x[3] for x in v})))
