"""The cache's cap (STOKE_CACHE_LIMIT) and its read-ahead across forks, against nginx on
127.0.0.1, with sidecar indexes (the shards' sizes known before their downloads; docs/sources.md,
"The cache"):
1. an epoch with a cap of two shards and the read-ahead on: the directory (copies and .part
   files at their apparent size) never holds more than the cap, at the end nor at any moment
   seen, and each shard's samples equal the local ones;
2. eviction goes least recently used first (the access time a read sets);
3. a copy a reader holds open is not evicted (another process over the cap leaves it, and
   `stoke cache ls` says it is in use); once it is closed, it is;
4. a shard bigger than the cap evicts every copy not in use and is kept alone, over the cap by
   it (the cache kept every such shard: a cap below every shard let the directory grow without
   bound), and the read-ahead never evicts: into a full cache, the reads
   download (about once per shard and pass) and the directory stays within the cap;
5. worker processes (forked through the hooks) run none of the parent's read-ahead and do none
   of their own: behind a slow server, at most one download per worker at once, each shard once.
Skips (77) without nginx or libcurl; part 5 is not run under TSan (worker processes)."""
import os
import subprocess
import sys
import threading
import time

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

TSAN = os.environ.get("STOKE_PY_TSAN")
NSHARDS = 6
OPTS = ",fields=bin:cls:txt,ragged=txt"
SU = R.setup(NSHARDS, index=True)
CLI, work, root, paths, RANGE, ngdir, ng = (SU.cli, SU.work, SU.root, SU.paths, SU.rng, SU.ngdir,
                                            SU.ng)
size = {os.path.basename(p): os.path.getsize(p) for p in paths}
names = sorted(size)


def cdir(name):
    return os.path.join(work, name)


def dir_bytes(d):
    """The bytes of every file in d (apparent sizes: a reserved .part counts in full)."""
    total = 0
    for n in os.listdir(d) if os.path.isdir(d) else []:
        try:
            total += os.path.getsize(os.path.join(d, n))
        except OSError:  # renamed or removed meanwhile
            pass
    return total


def held(d):
    """{shard base name} of the complete copies in cache directory d."""
    return {n[33:] for n in os.listdir(d) if len(n) > 33 and n[32] == "-"}


def shard_gets(mark):
    """nginx's requests for shards (not their .idx) since mark: [uri]."""
    return [r[4] for r in S.access_log(ngdir)[mark:] if r[4].endswith(".tar")]


def load_one(base, name, env, *args):
    rc, out, err = R.load("tar:%s%s%s" % (base, name, OPTS), "--workers", "0", *args, env=env)
    T.check(rc == 0, "%s: %s %s" % (name, out.get("error"), err[-400:]))
    return out


servers = [ng]
try:
    base = ng.url("")

    # --- 1. an epoch under a cap of two shards, read-ahead on: never over the cap ---------------
    d1 = cdir("c1")
    cap = size[names[-1]] + size[names[-2]]  # the two last: the copies an epoch ends with
    cap = max(cap, 2 * max(size.values()))
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], dir_bytes(d1))
            time.sleep(0.001)

    t = threading.Thread(target=watch)
    t.start()
    mark = len(S.access_log(ngdir))
    try:
        runs = R.same_as_local(base, root, RANGE, "cap of two shards", "--workers", "0",
                               env={"STOKE_CACHE_DIR": d1, "STOKE_CACHE_LIMIT": str(cap),
                                    "STOKE_REMOTE_CONNECTIONS": "3"}, orders=R.ORDERS[:1])
    finally:
        done.set()
        t.join()
    end = dir_bytes(d1)
    gets = shard_gets(mark)
    T.check(end <= cap and peak[0] <= cap,
            "cap %d: %d bytes at the end, %d at the peak: over the cap" % (cap, end, peak[0]))
    # `stoke load` reads the epoch twice (the hash pass, then the timed one): in sequential
    # order under a cap of two shards, each shard is downloaded once per pass (a read-ahead
    # stopped by a close, or evicted before its read, may add one: no more than a few)
    per = {g: gets.count(g) for g in gets}
    T.check(sorted(per) == ["/" + n for n in names] and min(per.values()) == 2
            and len(gets) <= 2 * NSHARDS + 3,
            "cap %d: about one download per shard and pass: %s %s" % (cap, per, runs[0]["remote"]))
    T.check(runs[0]["remote"]["cache_evictions"] >= NSHARDS - 2,
            "cap %d: evictions %s" % (cap, runs[0]["remote"]))
    T.check(not [n for n in os.listdir(d1) if n.endswith(".part")],
            "a .part left: %s" % os.listdir(d1))
    print("1. cap %d: %d bytes at the peak, %d at the end, %d downloads" % (cap, peak[0], end,
                                                                          len(gets)))

    # --- 2. least recently used first ------------------------------------------------------------
    d2 = cdir("c2")
    env = {"STOKE_CACHE_DIR": d2, "STOKE_REMOTE_CONNECTIONS": "0"}
    for n in names[:4]:  # downloaded in this order, no cap
        load_one(base, n, env)
    order = [names[2], names[0], names[3], names[1]]  # then read in this one: 2 is the oldest
    for n in order:
        time.sleep(0.02)
        out = load_one(base, n, env)
        T.check(out["remote"]["cache_hits"] >= 1 and out["remote"]["requests"] == 0,
                "%s again: %s" % (n, out["remote"]))
    new = names[4]
    env["STOKE_CACHE_LIMIT"] = str(size[order[2]] + size[order[3]] + size[new])
    out = load_one(base, new, env)
    T.check(held(d2) == {order[2], order[3], new} and out["remote"]["cache_evictions"] == 2,
            "least recently used first: %s were read in that order, %s left after %s (%s)"
            % (order, sorted(held(d2)), new, out["remote"]))
    print("2. evicted %s, kept %s" % (order[:2], sorted(held(d2))))

    # --- 3. a copy held open by a reader is not evicted ---------------------------------------
    d3 = cdir("c3")
    reader = subprocess.Popen(
        [sys.executable, "-c", """
import sys, stoke
it = iter(stoke.DataLoader(sys.argv[1], batch_size=4, structure="list"))
n = len(next(it)[0])
print("ready", flush=True)
sys.stdin.readline()
n += sum(len(b[0]) for b in it)
print("read", n, flush=True)
""", "tar:%s%s,fields=bin:cls" % (base, names[0])],
        env=dict(os.environ, STOKE_CACHE_DIR=d3, STOKE_REMOTE_CONNECTIONS="0"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = reader.stdout.readline()
        T.check(line.strip() == "ready", "the reader: %r %s" % (line, reader.stderr.read()
                                                                 if reader.poll() is not None
                                                                 else ""))
        p = subprocess.run([CLI, "cache", "ls", d3, "--json"], capture_output=True, text=True,
                           timeout=60)
        import json
        ls = json.loads(p.stdout)
        T.check([(e["name"][33:], e["in_use"]) for e in ls["entries"]] == [(names[0], True)],
                "cache ls while the reader holds its copy: %s" % ls)
        # another process, a cap that holds one shard only: shard 0's copy must stay
        env = {"STOKE_CACHE_DIR": d3, "STOKE_REMOTE_CONNECTIONS": "0",
               "STOKE_CACHE_LIMIT": str(max(size.values()) + 1)}
        out = load_one(base, names[1], env)
        T.check(names[0] in held(d3) and out["remote"]["cache_evictions"] == 0,
                "a copy in use was evicted: %s, %s" % (sorted(held(d3)), out["remote"]))
        o, e = reader.communicate("go\n", timeout=120)
        T.check(reader.returncode == 0 and o.strip() == "read 12",
                "the reader after the other process: %r %s" % (o, e[-400:]))
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    out = load_one(base, names[2], env)  # shard 0 is no one's now: evicted (LRU, unlocked)
    T.check(names[0] not in held(d3) and out["remote"]["cache_evictions"] >= 1,
            "once closed, the copy is evicted: %s, %s" % (sorted(held(d3)), out["remote"]))
    print("3. a copy in use kept, then evicted")

    # --- 4. a shard over the cap evicts nothing; the read-ahead never evicts ---------------------
    d4 = cdir("c4")
    env = {"STOKE_CACHE_DIR": d4, "STOKE_REMOTE_CONNECTIONS": "0"}
    load_one(base, names[0], env)
    load_one(base, names[1], env)
    env["STOKE_CACHE_LIMIT"] = "1000"  # smaller than any shard
    R.same_as_local(base, root, names[2], "a shard over the cap", "--workers", "0", env=env,
                    orders=R.ORDERS[:1])
    T.check(held(d4) == set(names[2:3]),
            "a shard over the cap: the copies not in use stay: %s" % sorted(held(d4)))
    # and the next one evicts it: a cap below every shard holds one shard at a time (the
    # directory grew without bound)
    R.same_as_local(base, root, names[3], "another shard over the cap", "--workers", "0",
                    env=env, orders=R.ORDERS[:1])
    T.check(held(d4) == set(names[3:4]),
            "a second shard over the cap: %s held" % sorted(held(d4)))
    # a full cache (the cap is the two copies there): the read-ahead of shards 3.. finds no
    # room without evicting and leaves them to the reads, which evict (least recently used)
    d4b = cdir("c4b")
    env = {"STOKE_CACHE_DIR": d4b, "STOKE_REMOTE_CONNECTIONS": "0"}
    load_one(base, names[0], env)
    load_one(base, names[1], env)
    env = {"STOKE_CACHE_DIR": d4b, "STOKE_REMOTE_CONNECTIONS": "4",
           "STOKE_CACHE_LIMIT": str(size[names[0]] + size[names[1]])}
    mark = len(S.access_log(ngdir))
    rng = "shard-{000002..%06d}.tar" % (NSHARDS - 1)
    R.same_as_local(base, root, rng, "read-ahead into a full cache", "--workers", "0",
                    env=env, orders=R.ORDERS[:1])
    gets = shard_gets(mark)
    per = {g: gets.count(g) for g in gets}
    T.check(sorted(per) == ["/" + n for n in names[2:]] and min(per.values()) == 2
            and len(gets) <= 2 * (NSHARDS - 2) + 3,
            "read-ahead into a full cache: about one download per shard and pass: %s" % per)
    T.check(dir_bytes(d4b) <= size[names[0]] + size[names[1]],
            "read-ahead into a full cache: %d bytes left" % dir_bytes(d4b))
    print("4. over the cap: kept alone; a full cache: %d downloads" % len(gets))

    # --- 5. worker processes: no read-ahead of the parent's or their own -------------------------
    if TSAN:
        print("5. not run under TSan:", TSAN)
    else:
        sdir = os.path.join(work, "nginx-slow")
        slow = S.start_nginx(root, sdir, extra="limit_rate 3m;")
        servers.append(slow)
        mark = len(S.timings(sdir))
        R.same_as_local(slow.url(""), root, RANGE, "worker processes, read-ahead on",
                        "--workers", "2", "--worker-mode=processes", orders=R.ORDERS[:1],
                        env={"STOKE_CACHE_DIR": cdir("c5"), "STOKE_REMOTE_CONNECTIONS": "3"})
        rows = [r for r in S.timings(sdir)[mark:] if r[4].endswith(".tar")]
        T.check(sorted(r[4] for r in rows) == ["/" + n for n in names],
                "worker processes: each shard fetched once: %s" % rows)
        most = S.most_at_once(rows)
        T.check(most <= 2, "worker processes: %d downloads at once (2 workers, no read-ahead): %s"
                % (most, rows))
        print("5. worker processes: %d downloads, %d at once" % (len(rows), most))
finally:
    for s in servers:
        s.stop()
print("the cache's cap and its read-ahead across forks: ok")
