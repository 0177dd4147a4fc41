"""The cache's downloads in chunks (docs/sources.md, "The cache"): with STOKE_STREAM_AHEAD=1M
and STOKE_REMOTE_CONNECTIONS=8 a chunk is 64 KiB, so each ~1.8 MB shard is fetched as about 28
range requests on the pool's connections at once, written at their offsets into the .part.
Against nginx and tests/remote/fault_server.py on 127.0.0.1: the samples equal the local
shards'; nginx's log shows each chunk's range asked once, the ranges tiling each shard, on at
most STOKE_REMOTE_CONNECTIONS connections, the open's own (its sidecar-index asks) among them and
no other; two processes at once still download each chunk once;
503s, cuts, resets and a server that ignores ranges (norange: one 200 per shard, its whole body
taken) give every sample once and leave no .part; a download killed by SIGKILL half way leaves
nothing a later run uses.  Skips (77) without nginx or libcurl."""
import collections
import hashlib
import os
import signal
import subprocess
import sys
import time

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

NSHARDS = 4
CHUNK = 64 << 10
OPTS = ",fields=txt:bin:cls,ragged=txt"
SU = R.setup(NSHARDS)
CLI, work, root, paths, RANGE, ngdir, ng = (SU.cli, SU.work, SU.root, SU.paths, SU.rng, SU.ngdir,
                                            SU.ng)
size = {"/" + os.path.basename(p): os.path.getsize(p) for p in paths}
digest = {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}
T.check(all(s > 8 * CHUNK for s in size.values()), "shards too small to chunk: %s" % size)


def cache_env(name, **more):
    env = {"STOKE_CACHE_DIR": os.path.join(work, name), "STOKE_STREAM_AHEAD": "1M",
           "STOKE_REMOTE_CONNECTIONS": "8"}
    env.update(more)
    return env


def check_cache_dir(name):
    """Every shard's copy whole (sha256), nothing partial left."""
    d = os.path.join(work, name)
    got = {n[33:]: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
           for n in os.listdir(d) if len(n) > 33 and n[32] == "-"}
    T.check(got == digest, "%s: copies %s, shards %s" % (name, sorted(got), sorted(digest)))
    T.check(not any(n.endswith(".part") for n in os.listdir(d)), "%s: %s" % (name, os.listdir(d)))


def check_tiling(rows, what):
    """rows: nginx's shard requests; each shard's ranges asked once, 206, tiling [0, size) in
    chunks of CHUNK bytes."""
    per = collections.defaultdict(list)
    for r in rows:
        T.check(r[2] == 206 and r[3].startswith("bytes="), "%s: %s" % (what, r))
        a, b = r[3][len("bytes="):].split("-")
        per[r[4]].append((int(a), int(b)))
    T.check(sorted(per) == sorted(size), "%s: shards asked for: %s" % (what, sorted(per)))
    for uri, rs in per.items():
        want = [(a, min(a + CHUNK, size[uri]) - 1 if a else CHUNK - 1)
                for a in range(0, size[uri], CHUNK)]
        T.check(sorted(rs) == want, "%s: %s: ranges %s, want each of %s once" % (
            what, uri, sorted(rs)[:6], want[:6]))


servers = [ng]
try:
    base = ng.url("")
    # --- a cold cache: the samples, each chunk once, on the pool's connections ----------------
    mark = len(S.access_log(ngdir))
    first = R.same_as_local(base, root, RANGE, "chunked cache, 0 workers", "--workers", "0",
                            env=cache_env("c1"), orders=R.ORDERS[:1], samples=NSHARDS * 12)
    rows = [r for r in S.access_log(ngdir)[mark:] if r[4].endswith(".tar")]
    check_tiling(rows, "cold cache")
    conns = {r[0] for r in rows}
    T.check(len(conns) <= 8, "the chunks came on %d connections (8 at most)" % len(conns))
    # the open's sidecar-index asks (404 here) and the chunks share the 8 connections: the
    # open's first connection is handed to a download lane, its later asks run on the lanes
    every = S.access_log(ngdir)[mark:]
    idx = [r for r in every if r[4].endswith(".tar.idx")]
    T.check(1 <= len(idx) <= NSHARDS and all(r[2] == 404 for r in idx),  # a shard in the
            "index asks: %s (a 404 per shard at most)" % idx)  # cache already is not asked
    T.check({r[0] for r in every} == conns, "connections: %s, those that carried chunks: %s" % (
        sorted({r[0] for r in every}), sorted(conns)))
    T.check(every[0][4].endswith(".tar.idx") and
            sum(r[0] == every[0][0] for r in rows) >= 2,
            "the open's connection %s (its first request %s) carried %d chunk(s)" % (
                every[0][0], every[0][4], sum(r[0] == every[0][0] for r in rows)))
    rem = first[0]["remote"]
    T.check(rem["cache_misses"] == NSHARDS and rem["cache_bytes"] == sum(size.values()),
            "counters: %s" % rem)
    check_cache_dir("c1")
    R.same_as_local(base, root, RANGE, "chunked cache, 2 workers, shuffled", "--workers", "2",
                    "--shuffle", "--seed", "5", env=cache_env("c1"), orders=R.ORDERS[1:2])

    # --- two processes at once: each chunk still asked for once --------------------------------
    mark = len(S.access_log(ngdir))
    env = dict(os.environ, **cache_env("c2"))
    spec = "tar:%s%s%s" % (base, RANGE, OPTS)
    procs = [subprocess.Popen([CLI, "load", spec, "--json", "--no-hash", "--no-pin-memory",
                               "--workers", "2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    T.check(all(p.returncode == 0 for p in procs), "two processes: %s" % [o[1] for o in outs])
    check_tiling([r for r in S.access_log(ngdir)[mark:] if r[4].endswith(".tar")],
                 "two processes")
    check_cache_dir("c2")

    # --- faults: every sample once, every copy whole, nothing partial --------------------------
    fs = S.start_fault_server(root, work)
    servers.append(fs)
    for mode in ("503/2/", "cut/1/", "reset/1/", "norange/0/"):
        name = "c3" + mode.split("/")[0]
        before = fs.log().count(".tar HTTP")
        R.same_as_local(fs.url(mode), root, RANGE, "chunked downloads, %s" % mode, "--workers",
                        "1", env=cache_env(name, STOKE_REMOTE_CONNECTIONS="4",
                                           STOKE_STREAM_AHEAD="512K"), orders=R.ORDERS[:1])
        check_cache_dir(name)
        if mode == "norange/0/":  # the first chunk's 200 brought the whole shard: no other
            n = fs.log().count(".tar HTTP") - before
            T.check(n == NSHARDS, "norange: %d requests for %d shards" % (n, NSHARDS))

    # --- SIGKILL half way: nothing a later run uses ---------------------------------------------
    slow = S.start_nginx(root, os.path.join(work, "nginx-slow"), extra="limit_rate 200k;")
    servers.append(slow)
    cdir = os.path.join(work, "c4")
    one = "shard-000000.tar"
    p = subprocess.Popen([CLI, "load", "tar:%s%s%s" % (slow.url(""), one, OPTS), "--json",
                          "--no-pin-memory"], env=dict(os.environ, **cache_env("c4")),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    part = None
    while part is None and time.monotonic() < end and p.poll() is None:
        for n in os.listdir(cdir) if os.path.isdir(cdir) else []:
            st = os.stat(os.path.join(cdir, n)) if n.endswith(".part") else None
            if st and st.st_blocks * 512 >= 4 * CHUNK:  # a few chunks written (sparse file)
                part = n
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    T.check(part is not None, "no half-written .part appeared: %s" % os.listdir(cdir))
    T.check(not any(len(n) > 33 and n[32] == "-" for n in os.listdir(cdir)),
            "a killed download left a copy: %s" % os.listdir(cdir))
    R.same_as_local(base, root, one, "after a killed download", "--workers", "2",
                    env=cache_env("c4"), orders=R.ORDERS[:1], samples=12)
    d = os.listdir(cdir)
    T.check(sum(len(n) > 33 and n[32] == "-" for n in d) == 1 and
            not any(n.endswith(".part") for n in d), "c4: %s" % d)
finally:
    for s in servers:
        s.stop()
print("chunked cache downloads: ok")
