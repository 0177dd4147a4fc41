"""The local cache of remote shards (STOKE_CACHE_DIR, STOKE_CACHE_LIMIT; docs/sources.md,
"Remote shards", "The cache"), against nginx and tests/remote/fault_server.py on 127.0.0.1:
samples equal to the local shards' through the cache (0, 1 and 2 worker threads, worker
processes); two processes loading the same shards at once download each shard once (nginx's
access log); a second run downloads nothing; a cap smaller than the shards evicts and stays
within cap + one shard; a download killed by SIGKILL half way leaves nothing a later run uses;
a download cut short is resumed by range, and one that fails never lands in the cache.  Skips
(77) without nginx or libcurl, saying why."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

NSHARDS = 4
OPTS = ",fields=txt:bin:cls,ragged=txt"
SU = R.setup(NSHARDS)
CLI, work, root, paths, RANGE, ngdir, ng = (SU.cli, SU.work, SU.root, SU.paths, SU.rng, SU.ngdir,
                                            SU.ng)
digest = {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}
biggest = max(os.path.getsize(p) for p in paths)


def cache_env(name, **more):
    env = {"STOKE_CACHE_DIR": os.path.join(work, name)}
    env.update(more)
    return env


def copies(d):
    """The complete copies in cache directory d: {shard base name: sha256}."""
    out = {}
    for n in os.listdir(d) if os.path.isdir(d) else []:
        if len(n) > 33 and n[32] == "-":
            out[n[33:]] = hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
    return out


def check_copies(d, what):
    c = copies(d)
    T.check(c and all(digest[k] == v for k, v in c.items()),
            "%s: cached copies differ from the shards: %s" % (what, sorted(c)))
    return c


def requests_since(mark):
    """nginx's requests for shards since mark (not the sidecar indexes .idx: there are none
    here; a shard not in the cache has its URL.idx asked for at open, answered 404)."""
    return [r for r in S.access_log(ngdir)[mark:] if not r[4].endswith(".idx")]


def index_asks(mark):
    rows = [r for r in S.access_log(ngdir)[mark:] if r[4].endswith(".idx")]
    T.check(all(r[2] == 404 for r in rows), "index requests: %s" % rows)
    return len(rows)


servers = [ng]
try:
    base = ng.url("")
    # --- through the cache, equal to the local shards ------------------------------------------
    mark = len(S.access_log(ngdir))
    env = cache_env("c1")
    first = R.same_as_local(base, root, RANGE, "cache, 0 workers", "--workers", "0", env=env,
                            samples=NSHARDS * 12)
    rows = requests_since(mark)
    rem = first[0]["remote"]
    # one index request per shard not in the cache when the open reaches it (the read-ahead
    # may have brought the later ones already)
    asks = index_asks(mark)
    T.check(1 <= asks <= NSHARDS, "index requests: %d" % asks)
    # ... on the download connections: no shard had an index, so none is fetched ahead (their
    # 404s would open STOKE_REMOTE_CONNECTIONS connections beside the downloads'), and the
    # open's connection is handed to a download thread, its asks after it run on those threads
    all_conns = {r[0] for r in S.access_log(ngdir)[mark:]}
    T.check(len(all_conns) <= 8, "requests on %d connections (8 download threads)"
            % len(all_conns))
    T.check(rem["shards"] == NSHARDS and rem["cached"] is True
            and rem["requests"] == NSHARDS + asks
            and rem["cache_misses"] == NSHARDS and rem["cache_bytes"] == sum(map(os.path.getsize, paths))
            and rem["bytes"] == rem["cache_bytes"], "first run's counters: %s" % rem)
    T.check(all(r["remote"]["requests"] == 0 and r["remote"]["cache_misses"] == 0 and
                r["remote"]["cache_hits"] >= NSHARDS for r in first[1:]),
            "the runs after it: %s" % [r["remote"] for r in first[1:]])
    # shards smaller than a chunk (STOKE_STREAM_AHEAD / (2 x 8) = 4 MiB): one request each
    T.check(len(rows) == NSHARDS and all(r[2] == 206 and r[3] == "bytes=0-%d" % ((4 << 20) - 1)
                                         for r in rows),
            "the first runs downloaded each shard once, whole: %s" % rows)
    check_copies(env["STOKE_CACHE_DIR"], "c1")
    R.same_as_local(base, root, RANGE, "cache, 1 worker, shuffled", "--workers", "1",
                    "--shuffle", "--seed", "3", env=env, orders=R.ORDERS[:1])
    R.same_as_local(base, root, RANGE, "cache, 2 workers, shuffled", "--workers", "2",
                    "--shuffle", "--seed", "4", env=env, orders=R.ORDERS[1:2])
    if not os.environ.get("STOKE_PY_TSAN"):  # TSan: no fork while 64 locks are held
        R.same_as_local(base, root, RANGE, "cache, worker processes", "--workers", "2",
                        "--shuffle", "--worker-mode=processes", env=env, orders=R.ORDERS[2:])
        # worker processes that download: a cold cache, each shard still fetched once
        mark = len(S.access_log(ngdir))
        R.same_as_local(base, root, RANGE, "cold cache, worker processes", "--workers", "2",
                        "--worker-mode=processes", env=cache_env("c1p"), orders=R.ORDERS[:1])
        T.check(len(requests_since(mark)) == NSHARDS,
                "worker processes: %s" % requests_since(mark))
        # worker processes that download (a cap of one shard): their counts reach the parent
        mark = len(S.access_log(ngdir))
        rc, out, err = R.load("tar:%s%s%s" % (base, RANGE, OPTS), "--workers", "2",
                              "--worker-mode=processes", "--no-hash",
                              env=cache_env("c1q", STOKE_CACHE_LIMIT=str(biggest)))
        rem, n = out.get("remote") or {}, len(requests_since(mark))
        T.check(rc == 0 and n > NSHARDS and rem["requests"] == n + index_asks(mark)
                and rem["cache_misses"] == n
                and rem["cache_evictions"] > 0,
                "worker processes downloading: %d requests at the server, %s %s" % (n, rem, err))
    else:
        print("not run under TSan: the worker-process cases (%s)" % os.environ["STOKE_PY_TSAN"])
    # a second run: everything from the cache, not one request
    mark = len(S.access_log(ngdir))
    rc, out, err = R.load("tar:%s%s%s" % (base, RANGE, OPTS), "--workers", "2", env=env)
    T.check(rc == 0 and out["samples"] == NSHARDS * 12, "second run: %s %s" % (out, err))
    T.check(requests_since(mark) == [], "second run: requests %s" % requests_since(mark))
    rem = out["remote"]
    T.check(rem["requests"] == 0 and rem["bytes"] == 0 and rem["cache_misses"] == 0 and
            rem["cache_hits"] >= NSHARDS, "second run's counters: %s" % rem)
    # stoke cache ls lists what the runs left
    p = subprocess.run([CLI, "cache", "ls", env["STOKE_CACHE_DIR"], "--json"],
                       capture_output=True, text=True, timeout=60)
    ls = json.loads(p.stdout)
    T.check(p.returncode == 0 and ls["count"] == NSHARDS and sorted(
        e["name"][33:] for e in ls["entries"]) == sorted(digest) and ls["bytes"] == sum(
        map(os.path.getsize, paths)) and ls["partial_bytes"] == 0, "cache ls: %s" % ls)

    # a copy cut short after its rename (a power cut before its pages reached the disk): its
    # walk fails, so it is removed and downloaded again, with a warning; every later open
    # failed on it ("the archive ends at byte N")
    cut = os.path.join(env["STOKE_CACHE_DIR"], next(
        n for n in os.listdir(env["STOKE_CACHE_DIR"]) if n.endswith("-shard-000001.tar")))
    os.truncate(cut, os.path.getsize(cut) // 2)
    mark = len(S.access_log(ngdir))
    rc, again, err = R.load("tar:%s%s%s" % (base, RANGE, OPTS), "--workers", "2", env=env)
    T.check(rc == 0 and again["content_hash"] == out["content_hash"]
            and "downloaded again" in err and [r[4] for r in requests_since(mark)]
            == ["/shard-000001.tar"], "a copy cut short: %s %s %s" % (
                R.summary(again), err[-400:], requests_since(mark)))
    check_copies(env["STOKE_CACHE_DIR"], "c1, downloaded again")

    # --- two processes at once: each shard downloaded once -------------------------------------
    mark = len(S.access_log(ngdir))
    env = dict(os.environ, **cache_env("c2"))
    spec = "tar:%s%s%s" % (base, RANGE, OPTS)
    procs = [subprocess.Popen([CLI, "load", spec, "--json", "--batch-size", "5",
                               "--no-pin-memory", "--workers", "2"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    _, want, _ = R.load("tar:%s/%s%s" % (root, RANGE, OPTS), "--workers", "2")
    for p, (o, e) in zip(procs, outs):
        T.check(p.returncode == 0 and R.summary(json.loads(o)) == R.summary(want),
                "two processes: %s %s" % (o, e))
    rows = requests_since(mark)
    per = {}
    for r in rows:
        per[r[4]] = per.get(r[4], 0) + 1
    T.check(len(rows) == NSHARDS and set(per.values()) == {1},
            "two processes at once: requests per shard %s" % per)
    check_copies(env["STOKE_CACHE_DIR"], "c2")

    # --- a cap smaller than the shards: eviction, within cap + one shard ------------------------
    cdir = os.path.join(work, "c3")
    cap = 2 * biggest
    peak = [0]
    done = threading.Event()

    def watch():  # the directory's bytes while the run goes on
        while not done.is_set():
            try:
                size = sum(os.path.getsize(os.path.join(cdir, n)) for n in os.listdir(cdir))
            except OSError:
                size = 0
            peak[0] = max(peak[0], size)
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    mark = len(S.access_log(ngdir))
    try:
        over = R.same_as_local(base, root, RANGE, "cache over its cap", "--workers", "0",
                               env=cache_env("c3", STOKE_CACHE_LIMIT=str(cap)),
                               orders=R.ORDERS[:1])
    finally:
        done.set()
        t.join()
    left = sum(os.path.getsize(os.path.join(cdir, n)) for n in os.listdir(cdir))
    T.check(left <= cap and peak[0] <= cap + biggest,
            "cap %d: %d bytes left, %d at the peak (a shard: up to %d)" % (cap, left, peak[0],
                                                                          biggest))
    T.check(len(requests_since(mark)) > NSHARDS,
            "cap %d: %d downloads: nothing was evicted" % (cap, len(requests_since(mark))))
    check_copies(cdir, "c3")
    T.check(over[0]["remote"]["cache_evictions"] > 0, "cap: %s" % over[0]["remote"])
    print("cap %d: %d downloads, %d bytes at the peak, %d left" % (
        cap, len(requests_since(mark)), peak[0], left))

    # --- a cache directory that cannot be one: the open fails naming it ------------------------
    notdir = os.path.join(work, "a-file")
    open(notdir, "w").close()
    rc, out, err = R.load("tar:%s%s%s" % (base, RANGE, OPTS), env={"STOKE_CACHE_DIR": notdir})
    T.check(rc == 1 and "STOKE_CACHE_DIR=%s: Not a directory" % notdir in out["error"],
            "a file as STOKE_CACHE_DIR: %s" % out["error"])

    # --- a cache directory others can write in is refused: a file put there would be read as a
    # shard, a link as HASH.part had the shard's bytes written through it (into any file this
    # process may write), a FIFO as the copy hung the open, a lock held made every load wait
    one = "shard-000000.tar"
    spec = "tar:%s%s%s" % (base, one, OPTS)
    shared = os.path.join(work, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    rc, out, err = R.load(spec, env={"STOKE_CACHE_DIR": shared})
    T.check(rc == 1 and "STOKE_CACHE_DIR=%s is writable by others (mode 0777)" % shared
            in out["error"], "a world-writable cache directory: %s" % out["error"])
    if os.geteuid() == 0:  # (root can give it away: another uid's directory)
        os.chmod(shared, 0o755)
        os.chown(shared, 65534, 65534)
        rc, out, err = R.load(spec, env={"STOKE_CACHE_DIR": shared})
        T.check(rc == 1 and "is owned by uid 65534, not by this process's (0)" in out["error"],
                "another uid's cache directory: %s" % out["error"])
    # one it makes is its own only, and so are the copies; links and FIFOs in it are not used
    own = os.path.join(work, "own", "cache")
    rc, out, err = R.load(spec, env={"STOKE_CACHE_DIR": own})
    names = [n for n in os.listdir(own) if n.endswith("-" + one)]
    T.check(rc == 0 and len(names) == 1 and os.stat(own).st_mode & 0o777 == 0o700
            and os.stat(os.path.join(own, names[0])).st_mode & 0o777 == 0o600,
            "a new cache directory: %s %s" % (oct(os.stat(own).st_mode), os.listdir(own)))
    h = names[0][:32]
    victim = os.path.join(work, "victim")
    with open(victim, "w") as f:
        f.write("not a shard")
    os.unlink(os.path.join(own, names[0]))
    os.symlink(victim, os.path.join(own, h + ".part"))
    rc, out, err = R.load(spec, env={"STOKE_CACHE_DIR": own})
    T.check(rc == 1 and open(victim).read() == "not a shard",
            "a link as the .part: written through (%s)" % out.get("error"))
    os.unlink(os.path.join(own, h + ".part"))
    os.mkfifo(os.path.join(own, names[0]))
    rc, out, err = R.load(spec, env={"STOKE_CACHE_DIR": own}, timeout=60)
    T.check(rc == 1 and names[0] in out["error"], "a FIFO as the copy: %s" % out.get("error"))
    os.unlink(os.path.join(own, names[0]))
    # two URLs that differ only in a secret-looking query value ("***" in messages) are two
    # files: they shared one copy (nginx serves the same file for both: counted in copies);
    # the same URL signed again (a presigned URL's X-Amz-Signature, an Azure SAS's sig) is the
    # same copy; a parameter named as a signing one where the query has no such signature
    # selects content (?sp=train, ?sp=val: one copy served both)
    qdir = os.path.join(work, "query")
    for q in ("key=a&X-Amz-Signature=1", "key=b&X-Amz-Signature=1", "key=a&X-Amz-Signature=22",
              "sp=train", "sp=val", "sv=1&sp=r&sig=A", "sv=1&sp=r&sig=B&se=9",
              "Expires=1&Signature=A&Key-Pair-Id=K", "Expires=2&Signature=B&Key-Pair-Id=K",
              "GoogleAccessId=g&Expires=3&Signature=C"):
        rc, out, err = R.load("tar:%s%s?%s%s" % (base, one, q, OPTS),
                              env={"STOKE_CACHE_DIR": qdir})
        T.check(rc == 0, "?%s: %s" % (q, out.get("error")))
    # (the SAS, CloudFront's and GCS V2's queries are all signing parameters: one copy)
    T.check(len([n for n in os.listdir(qdir) if n[32:33] == "-"]) == 5,
            "?key=a, ?key=b, ?key=a signed again, ?sp=train, ?sp=val, a SAS twice, "
            "CloudFront's and GCS V2's signatures: copies %s" % os.listdir(qdir))

    # --- faults: fault_server.py -----------------------------------------------------------------
    fs = S.start_fault_server(root, work)
    servers.append(fs)
    # a download killed half way (stall/1: the first request of each path sends half and
    # stops): its .part is never used, the next run downloads the shard again
    cdir = os.path.join(work, "c4")
    url, one = fs.url("stall/1/"), "shard-000000.tar"
    p = subprocess.Popen([CLI, "load", "tar:%s%s%s" % (url, one, OPTS), "--json",
                          "--no-pin-memory"], env=dict(os.environ, **cache_env("c4")),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60
    half = os.path.getsize(paths[0]) // 2
    part = None
    while part is None and time.monotonic() < end and p.poll() is None:
        for n in os.listdir(cdir) if os.path.isdir(cdir) else []:
            if n.endswith(".part") and os.path.getsize(os.path.join(cdir, n)) >= half:
                part = n
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    T.check(part is not None, "no half-written .part appeared: %s" % os.listdir(cdir))
    T.check(copies(cdir) == {}, "a killed download left a copy: %s" % os.listdir(cdir))
    R.same_as_local(url, root, one, "after a killed download", "--workers", "2",
                    env=cache_env("c4"), orders=R.ORDERS[:1], samples=12)
    T.check(sorted(check_copies(cdir, "c4")) == [one], "c4: %s" % os.listdir(cdir))
    T.check(not any(n.endswith(".part") for n in os.listdir(cdir)),
            "a .part is left: %s" % os.listdir(cdir))

    # a download that keeps failing: the open's error names the URL and the status; nothing
    # lands in the cache
    cdir = os.path.join(work, "c5")
    url = fs.url("cut/1/")
    rc, out, err = R.load("tar:%s%s%s" % (url, RANGE, OPTS),
                          env=cache_env("c5", STOKE_REMOTE_RETRIES="0"))
    T.check(rc == 1 and url + "shard-000000.tar" in out["error"] and "GET" in out["error"],
            "a download cut short, no retries: %s" % out["error"])
    T.check(copies(cdir) == {} and not any(n.endswith(".part") for n in os.listdir(cdir)),
            "a failed download left %s" % os.listdir(cdir))
    bad = fs.url("failat/0/")
    rc, out, err = R.load("tar:%s%s%s" % (bad, RANGE, OPTS),
                          env=cache_env("c5", STOKE_REMOTE_RETRIES="1"))
    T.check(rc == 1 and bad + "shard-000000.tar" in out["error"] and "HTTP 500" in out["error"]
            and "InternalError" in out["error"] and "after 2 tries" in out["error"],
            "a download that fails: %s" % out["error"])
    T.check(copies(cdir) == {}, "a failed download left %s" % os.listdir(cdir))
    # cut short twice: continued by range from the byte it stopped at, the copy whole
    url = fs.url("cut/2/")
    cut = R.same_as_local(url, root, RANGE, "downloads cut short", "--workers", "2",
                          env=cache_env("c6"), orders=R.ORDERS[:1])
    rem = cut[0]["remote"]
    T.check(rem["retries"] == 2 * NSHARDS and 3 * NSHARDS < rem["requests"] <= 4 * NSHARDS
            and
            rem["cache_misses"] == NSHARDS, "cut/2: %s" % rem)
    check_copies(os.path.join(work, "c6"), "c6")
    log = fs.log()
    T.check(any(("bytes=%d-" % (os.path.getsize(paths[0]) // 2)) in line for line in
                log.splitlines()), "no download was resumed by range: %s" % log[-2000:])
    # parallel downloads through faults: every sample once, every copy whole, nothing partial
    for mode in ("reset/1/", "503/2/", "cut/1/"):
        name = "c7" + mode.split("/")[0]
        R.same_as_local(fs.url(mode), root, RANGE, "parallel downloads, %s" % mode, "--workers",
                        "1", env=cache_env(name, STOKE_REMOTE_CONNECTIONS="4"),
                        orders=R.ORDERS[:1])
        cdir = os.path.join(work, name)
        T.check(sorted(check_copies(cdir, name)) == sorted(digest) and
                not any(n.endswith(".part") for n in os.listdir(cdir)),
                "%s: %s" % (mode, os.listdir(cdir)))

    # the downloads overlap: a server limited per connection (limit_rate), a cold cache; nginx's
    # times of each request show how many ran at once (no timing is asserted, only overlap)
    sdir = os.path.join(work, "nginx-slow")
    slow = S.start_nginx(root, sdir, extra="limit_rate 4m;")
    servers.append(slow)
    cases = [("3", "0", "threads", 3), ("0", "0", "threads", 1)]
    if not os.environ.get("STOKE_PY_TSAN"):  # TSan: no fork while 64 locks are held
        cases.append(("3", "2", "processes", 3))
    for conns, workers, mode, want in cases:
        mark = len(S.timings(sdir))
        what = "STOKE_REMOTE_CONNECTIONS=%s, %s worker %s" % (conns, workers, mode)
        R.same_as_local(slow.url(""), root, RANGE, what, "--workers", workers,
                        "--worker-mode=" + mode, orders=R.ORDERS[:1],
                        env=cache_env("c8-%s-%s" % (conns, mode), STOKE_REMOTE_CONNECTIONS=conns))
        trows = [r for r in S.timings(sdir)[mark:] if r[4].endswith(".tar")]
        T.check(sorted(r[4] for r in trows) == sorted("/" + n for n in digest),
                "%s: each shard fetched once: %s" % (what, trows))
        most = S.most_at_once(trows)
        T.check(most == want if want == 1 else most >= want,
                "%s: %d downloads at once (%d wanted): %s" % (what, most, want, trows))
finally:
    for s in servers:
        s.stop()
print("remote shards through the cache: ok")
