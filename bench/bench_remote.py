#!/usr/bin/python3
"""Remote tar shards against the same shards on local disk (issue 30's benchmark).

    python3 bench/bench_remote.py [--build build] [--shards 16] [--per-shard 400]
        [--sample-kb 40] [--workers 2] [--rate 20m] [--latency 10] [--repeat 2]
        [--json [FILE]]

nginx (Debian nginx-light, as the tests start it: tests/remote/servers.py) serves generated
WebDataset shards (KEY.bin of --sample-kb KiB of random bytes + KEY.cls) on 127.0.0.1.  Each
configuration is one `stoke load tar:... --workers W --batch-size 64 --no-hash --json` process,
timed from its start to its end by this script (the shards' open and header scan included: for a
remote source that is part of the cost):

  local cold      tar:DIR/shard-{...}.tar, the files dropped from the page cache first
                  (posix_fadvise DONTNEED)
  http            tar:http://127.0.0.1:PORT/shard-{...}.tar, range reads (no cache)
  http stream     the same with mode=stream (each worker GETs its shards whole, its next
                  ones while it reads one: STOKE_REMOTE_CONNECTIONS transfers at once per
                  worker, STOKE_STREAM_AHEAD bytes; no cache; docs/sources.md "Streaming")
  http cache cold the same with STOKE_CACHE_DIR set to an empty directory (whole shards
                  downloaded into it); skipped by a stoke without the cache
  http cached     the same again, the cache filled by the previous run
  limited         nginx with `limit_rate RATE` per connection (a store that caps each
                  connection) with range reads, with the cache, with range reads of shards
                  that have sidecar indexes (`stoke index`: the open reads no headers; the
                  .idx files are removed after), and with mode=stream, against the peer:
                  `curl` fetching the shards one after another (WebDataset's pipe:curl
                  model), and against connections x RATE (connections: the distinct
                  connections in nginx's access log)
  limited +N ms   the same rows again with --latency N ms (default 10) added to each
                  request's round trip: a proxy in this process (DelayProxy) passes the
                  requests on N ms after they came and the answers at once (the issue's
                  "plus added latency"; loopback's own is ~0.1 ms, and this kernel has no
                  netem); the curl peers go through it too

Per configuration the best of --repeat runs: MB/s of shard data (the shards' total size over
the wall time) and the ratio to "local cold" (targets: >= 0.8 cold, >= 0.95 cached); for the
limited server (one run each) the ratio to the curl peer and to connections x RATE (target
>= 0.8 of it), and what as many plain curls at once (at most one per shard) reach of the same
connections x RATE right after: the server's own ceiling on this machine.
Loopback only: it measures stoke's overheads (requests, round trips, copies), not a network.
"""
import argparse
import io
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "remote"))
import servers  # noqa: E402


def make_shards(root, nshards, per_shard, sample_bytes):
    os.makedirs(root, exist_ok=True)
    rng = random.Random(30)
    for s in range(nshards):
        p = os.path.join(root, "shard-%06d.tar" % s)
        if os.path.exists(p):
            continue
        with tarfile.open(p + ".part", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(per_shard):
                key = "s%04d_%05d" % (s, i)
                for ext, data in (("bin", rng.randbytes(sample_bytes)),
                                  ("cls", b"%d\n" % rng.randrange(1000))):
                    ti = tarfile.TarInfo("%s.%s" % (key, ext))
                    ti.size = len(data)
                    ti.mtime = 1700000000
                    t.addfile(ti, io.BytesIO(data))
        os.rename(p + ".part", p)
    return sum(os.path.getsize(os.path.join(root, "shard-%06d.tar" % s)) for s in range(nshards))


class DelayProxy:
    """127.0.0.1:PORT in front of 127.0.0.1:target: the bytes from the client (the requests)
    are passed on `delay` seconds after they came, the answers at once (os.splice, no copy
    through Python): each request's round trip is `delay` longer, as on a network with that
    latency (loopback's is ~0.1 ms).  One upstream connection per client connection, so nginx's
    access log still counts the client's connections."""

    def __init__(self, target, delay):
        self.target, self.delay = target, delay
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(512)
        self.port = self.ls.getsockname()[1]
        self.open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path=""):
        return "http://127.0.0.1:%d/%s" % (self.port, path.lstrip("/"))

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            u = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            c.close()
            return
        self.open += [c, u]
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._down, args=(u, c), daemon=True).start()
        try:
            while True:
                b = c.recv(65536)
                due = time.monotonic() + self.delay
                if not b:
                    u.shutdown(socket.SHUT_WR)
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                u.sendall(b)
        except OSError:
            for s in (c, u):
                s.close()

    @staticmethod
    def _down(u, c):
        r, w = os.pipe()
        try:
            while True:
                n = os.splice(u.fileno(), w, 1 << 20)
                if not n:
                    c.shutdown(socket.SHUT_WR)
                    return
                while n:
                    n -= os.splice(r, c.fileno(), n)
        except OSError:
            for s in (c, u):
                s.close()
        finally:
            os.close(r)
            os.close(w)

    def stop(self):
        self.ls.close()
        for s in self.open:
            try:
                s.close()
            except OSError:
                pass


def drop_cache(root):
    for name in os.listdir(root):
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_stoke(cli, spec, workers, env=None):
    cmd = [cli, "load", spec, "--workers", str(workers), "--batch-size", "64", "--no-hash",
           "--no-pin-memory", "--json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    try:
        js = json.loads(out.stdout)
    except ValueError:
        js = {"ok": False, "error": (out.stdout + out.stderr).strip()[-300:]}
    js["wall_s"] = wall
    js["command"] = " ".join(cmd)
    return js


def run_curl(url_of, nshards):
    """The peer: curl fetching the shards one after another, the bytes read by this process
    (as `pipe:curl -s URL` hands them to a WebDataset reader)."""
    t0 = time.perf_counter()
    n = 0
    for s in range(nshards):
        p = subprocess.Popen(["curl", "-sf", url_of(s)], stdout=subprocess.PIPE)
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            n += len(b)
        if p.wait() != 0:
            raise RuntimeError("curl %s failed" % url_of(s))
    return n, time.perf_counter() - t0


def run_curls(url_of, nshards, k):
    """What the server delivers on k connections: k curls at once, curl i fetching shards i,
    i + k, ... one after another on its one connection (to /dev/null).  Seconds."""
    t0 = time.perf_counter()
    ps = []
    for i in range(min(k, nshards)):
        cmd = ["curl", "-sf"]
        for sh in range(i, nshards, k):
            cmd += ["-o", "/dev/null", url_of(sh)]
        ps.append(subprocess.Popen(cmd))
    if any(q.wait() != 0 for q in ps):
        raise RuntimeError("curl failed")
    return time.perf_counter() - t0


def rate_bytes(text):
    m = re.fullmatch(r"(\d+)([kKmM]?)", text)
    if not m:
        sys.exit("--rate: a number with k or m, as nginx's limit_rate")
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2).lower()]


def connections(prefix):
    return len({row[0] for row in servers.access_log(prefix)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workdir", default="/tmp/stoke_bench_remote")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--per-shard", type=int, default=400)
    ap.add_argument("--sample-kb", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate", default="20m")
    ap.add_argument("--latency", type=int, default=10,
                    help="ms added to each request's round trip for the second set of limited "
                         "rows (DelayProxy; 0: none)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", nargs="?", const="-")
    a = ap.parse_args()
    cli = os.path.join(a.build, "stoke")
    data = os.path.join(a.workdir, "shards-%d-%d-%d" % (a.shards, a.per_shard, a.sample_kb))
    total = make_shards(data, a.shards, a.per_shard, a.sample_kb << 10)
    last = "%06d" % (a.shards - 1)
    pattern = "shard-{000000..%s}.tar" % last
    res = {"shards": a.shards, "bytes": total, "workers": a.workers, "runs": {},
           "load": os.getloadavg()[0]}
    out = sys.stderr if a.json == "-" else sys.stdout
    print("remote tar shards vs local disk: %d shards, %.1f MB, %d workers, load %.1f"
          % (a.shards, total / 1e6, a.workers, res["load"]), file=out)

    def best(name, fn):
        runs = [fn() for _ in range(a.repeat)]
        ok = [r for r in runs if r.get("ok", True)]
        res["runs"][name] = runs
        if not ok:
            print("  %-40s ERROR: %s" % (name, runs[-1].get("error")), file=out)
            return None
        r = min(ok, key=lambda r: r["wall_s"])
        mbps = total / r["wall_s"] / 1e6
        res[name] = mbps
        print("  %-40s %8.1f MB/s  (%.2f s)" % (name, mbps, r["wall_s"]), file=out, flush=True)
        return mbps

    def local():
        drop_cache(data)
        return run_stoke(cli, "tar:%s/%s" % (data, pattern), a.workers)

    base = best("local cold", local)
    tmp = tempfile.mkdtemp(prefix="bench_remote.")
    try:
        nginx = servers.start_nginx(data, os.path.join(tmp, "nginx"))
        try:
            spec = "tar:" + nginx.url(pattern)
            best("http", lambda: run_stoke(cli, spec, a.workers))
            best("http stream", lambda: run_stoke(cli, spec + ",mode=stream", a.workers))
            cache = os.path.join(tmp, "cache")

            def cold():
                shutil.rmtree(cache, ignore_errors=True)
                os.makedirs(cache)
                return run_stoke(cli, spec, a.workers, dict(os.environ, STOKE_CACHE_DIR=cache))
            probe = cold()
            if "cache_misses" not in (probe.get("remote") or {}):
                print("  (this stoke has no shard cache: its --json has no remote.cache_misses; "
                      "the cache rows are skipped)", file=out)
            else:
                best("http cache cold", cold)
                best("http cached", lambda: run_stoke(cli, spec, a.workers,
                                                       dict(os.environ, STOKE_CACHE_DIR=cache)))
        finally:
            nginx.stop()
        prefix = os.path.join(tmp, "nginx-limited")
        lim = servers.start_nginx(data, prefix, extra="limit_rate %s;" % a.rate)
        try:
            for delay in sorted({0, a.latency}):
                near = DelayProxy(lim.port, delay / 1e3) if delay else None
                try:
                    limited(a, cli, res, out, data, pattern, total, prefix,
                            near.url if near else lim.url, delay)
                finally:
                    if near:
                        near.stop()
        finally:
            lim.stop()
    except servers.Unavailable as e:
        print("  nginx: %s" % e, file=out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if base:
        for name in ("http", "http stream", "http cache cold", "http cached"):
            if res.get(name):
                print("  %-40s %.2f of local cold" % (name, res[name] / base), file=out)
    print("  targets: >= 0.8 of local cold (cache cold), >= 0.95 (cached); limited server "
          ">= 0.8 of connections x rate", file=out)
    if a.json:
        text = json.dumps(res, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)


def limited(a, cli, res, out, data, pattern, total, prefix, url_of, delay):
    """The limited server's rows (nginx at `prefix`, reached at url_of(path)); with delay, each
    request's round trip `delay` ms longer (DelayProxy), rows named "... +N ms"."""
    tmp = os.path.dirname(prefix)
    more = " +%d ms" % delay if delay else ""
    per = rate_bytes(a.rate)
    n, secs = run_curl(lambda s: url_of("shard-%06d.tar" % s), a.shards)
    res["curl" + more] = n / secs / 1e6
    print("  %-40s %8.1f MB/s  (%.2f s)" % ("limited%s: curl one after another" % more,
                                            res["curl" + more], secs), file=out,
          flush=True)
    configs = [("limited%s: stoke range reads" % more, None)]
    if res.get("http cached"):
        configs.append(("limited%s: stoke cache" % more, "cache"))
    configs.append(("limited%s: sidecar idx" % more, "index"))
    configs.append(("limited%s: stoke stream" % more, "stream"))
    for name, env in configs:
        mode = ""
        if env == "stream":  # mode=stream: one GET per shard, the workers' read-ahead
            env, mode = None, ",mode=stream"
        if env == "index":  # `stoke index` beside the shards, removed after the run
            p = subprocess.run([cli, "index", "tar:%s/%s" % (data, pattern)],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print("  %-40s (no stoke index: %s)" % (name, p.stderr.strip()[-200:]),
                      file=out)
                continue
            env = None
            indexed = True
        else:
            indexed = False
        if env:
            c = os.path.join(tmp, "cache-limited")
            shutil.rmtree(c, ignore_errors=True)
            os.makedirs(c)
            env = dict(os.environ, STOKE_CACHE_DIR=c)
        open(os.path.join(prefix, "access.log"), "w").close()
        try:
            r = run_stoke(cli, "tar:" + url_of(pattern) + mode, a.workers, env)
        finally:
            for f in os.listdir(data) if indexed else []:
                if f.endswith(".idx"):
                    os.remove(os.path.join(data, f))
        if not r.get("ok"):
            print("  %-40s ERROR: %s" % (name, r.get("error")), file=out)
            continue
        conns = connections(prefix)
        mbps = total / r["wall_s"] / 1e6
        cap = conns * per / 1e6
        # the server's own ceiling on as many connections, right after: plain curls
        ceil = total / run_curls(lambda s: url_of("shard-%06d.tar" % s), a.shards,
                                 conns) / 1e6
        res[name] = {"mb_s": mbps, "connections": conns, "cap_mb_s": cap, "run": r,
                     "curls_mb_s": ceil}
        print("  %-40s %8.1f MB/s  (%.2f s; %d connections x %s = %.1f MB/s: %.2f; "
              "curl %.2fx; %d curls at once: %.2f)"
              % (name, mbps, r["wall_s"], conns, a.rate, cap, mbps / cap,
                 mbps / res["curl" + more], min(conns, a.shards), ceil / cap), file=out,
              flush=True)


if __name__ == "__main__":
    main()
