"""The tar source's streaming mode over HTTP (docs/sources.md, "Streaming"), against nginx on
127.0.0.1 and tests/remote/fault_server.py: the samples of each epoch, in order, equal those of
the same streaming run over the local files (so also every sample once: test_tar_stream.py checks
the local runs against the shards) for 0/1/2 workers and 2 ranks; one request per chunk per
epoch (nginx's access log: a shard smaller than a chunk is one request; shards of several chunks
asked for exactly once, range by range), on connections kept from chunk to chunk; a missing
shard (404) a bad sample naming its URL; retried and resumed faults delivering every sample
once, also in chunks, from a server that ignores ranges, and a shard that shrinks between its
chunks an error; the cache.
Skips (77) without torch, nginx or the build's libcurl, saying why."""
import json
import os
import sys

import stoke_testlib as T

T.need("torch", "stoke")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402
from runs import load  # noqa: E402

R.need_cli_and_libcurl()
NSHARDS, PER = 6, 12
RNG = "shard-{000000..%06d}.tar" % (NSHARDS - 1)
OPTS = ",fields=bin:cls,mode=stream"
work = T.tmpdir()
root = os.path.join(work, "root")
paths, _ = S.make_shards(root, nshards=NSHARDS, per_shard=PER, big=60000)
ids = R.sample_ids(paths)
LOCAL = "tar:%s/%s%s" % (root, RNG, OPTS)
ngdir = os.path.join(work, "nginx")
try:
    ng = S.start_nginx(root, ngdir)
except S.Unavailable as e:
    T.skip(str(e))
servers = [ng]
for k in R.CACHE_ENV:
    os.environ.pop(k, None)


def open_and_reuse(rows, workers_want, what):
    """rows (nginx's access log of a stoke load) less the workers' requests workers_want
    ((uri, range) pairs) are the open's: of shard 0, 64 KiB then doubling; and the open's
    connection served a worker's request after them (it was handed over, not closed)."""
    import collections
    rest = collections.Counter((r[4], r[3]) for r in rows)
    rest.subtract(collections.Counter(workers_want))
    T.check(all(v >= 0 for v in rest.values()), "%s: requests missing: %s" % (what, rest))
    opened = sorted(k for k, v in rest.items() for _ in range(v))
    want, a, n = [], 0, 64 << 10
    while len(want) < len(opened):
        want.append(("/shard-000000.tar", "bytes=%d-%d" % (a, a + n - 1)))
        a, n = a + n, n * 2
    T.check(opened and opened == sorted(want), "%s: the open's requests %s" % (what, opened))
    # the open's first request ends before any worker's starts: the log's first line
    T.check((rows[0][1], rows[0][4], rows[0][3]) == (1,) + want[0]
            and any(r[0] == rows[0][0] and r[1] > len(want) for r in rows),
            "%s: the open's connection not reused: %s" % (what, rows))


def same_as_local(base, what, opts="", **kw):
    """An epoch of the stream at base equals the local stream's, sample for sample."""
    loc = R.stream_epoch(LOCAL + opts, ids, **kw)
    rem = R.stream_epoch("tar:%s%s%s%s" % (base, RNG, OPTS, opts), ids, **kw)
    T.check(rem == loc, "%s %s %s: remote %s, local %s" % (what, opts, kw, rem, loc))
    return rem


try:
    base = ng.url("")
    # --- the samples, in order, as the local stream's: 0/1/2 workers, epochs, 2 ranks --------
    for w in (0, 1, 2):
        for e in (0, 1):
            R.check_stream_epoch(same_as_local(base, "http", workers=w, epoch=e), NSHARDS, PER,
                                 "http, workers %d, epoch %d" % (w, e))
        ranks = [same_as_local(base, "http", ",rank=%d,world_size=2" % r, workers=w, epoch=1)
                 for r in (0, 1)]
        T.check(not set(ranks[0]) & set(ranks[1]), "workers %d: ranks share samples" % w)
        R.check_stream_epoch(ranks[0] + ranks[1], NSHARDS, PER, "http, 2 ranks, workers %d" % w)
    # an epoch left half way (transfers in flight abandoned): the next one as if it came first
    left = R.stream_after_abandon("tar:%s%s%s,shuffle_buffer=2" % (base, RNG, OPTS), ids)
    T.check(left == R.stream_epoch(LOCAL + ",shuffle_buffer=2", ids, epoch=1, workers=2),
            "epoch 1 after epoch 0 was left half way differs")
    order = R.shard_runs(same_as_local(base, "http", ",shuffle_buffer=0,seed=3", epoch=2))
    T.check(sorted(order) == list(range(NSHARDS)), "shuffle_buffer=0: shards %s" % order)

    # --- requests: one per shard per epoch (shards below the default chunk of 4 MiB: each its
    # first chunk's range), and the open's of the first shard's start (64 KiB), on the
    # workers' kept connections (the open's among them); the counters say the same ------------
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2", "--epochs", "2",
                        "--no-hash")
    rows = S.access_log(ngdir)[mark:]
    uris = sorted(r[4] for r in rows)
    want = sorted(["/shard-%06d.tar" % s for s in range(NSHARDS)] * 2 + ["/shard-000000.tar"])
    T.check(rc == 0 and out["samples"] == 2 * NSHARDS * PER, "2 epochs: %s %s" % (out, err))
    T.check(uris == want, "requests of 2 epochs: %s, expected %s" % (uris, want))
    T.check(all(r[2] == 206 for r in rows), "not all 206: %s" % rows)
    open_and_reuse(rows, [("/shard-%06d.tar" % s, "bytes=0-%d" % ((4 << 20) - 1))
                          for s in range(NSHARDS)] * 2, "2 epochs")
    # each worker's connections (its shard read and the ones ahead: 3 shards) kept: the second
    # epoch's requests all on connections the first opened
    T.check(len({r[0] for r in rows}) <= NSHARDS
            and sum(1 for r in rows if r[1] >= 2) >= NSHARDS, "connections not kept: %s" % rows)
    rem = out["remote"]
    T.check(rem["requests"] == 2 * NSHARDS + 1 and rem["retries"] == 0
            and rem["bytes"] >= 2 * sum(os.path.getsize(p) for p in paths)
            and rem["shards"] == NSHARDS, "counters: %s" % rem)
    rc_m, m, _ = load("tar:%s/%s,fields=bin:cls" % (root, RNG), "--workers", "2")
    rc_s, s, err = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2")
    T.check(rc_m == 0 and rc_s == 0 and s["content_hash"] == m["content_hash"]
            and s["samples"] == m["samples"], "CLI: stream %s, map %s" % (R.summary(s),
                                                                           R.summary(m)))

    # --- resume mid-epoch (state_dict after 5 batches, a new loader restored): the rest is the
    # uninterrupted epoch's; the restore reads each worker's shards again from their start, so
    # the resumed epoch makes one request per shard, as a whole epoch does (+ the open's) -------
    import stoke

    def mk():
        return stoke.DataLoader("tar:%s%s%s,seed=5,shuffle_buffer=4" % (base, RNG, OPTS),
                                batch_size=5, num_workers=2, structure="list", pin_memory=False)

    def samples(batches):
        return [ids[bytes(row.numpy())] for b in batches for row in b[0]]

    full = samples(mk())
    a = mk()
    it = iter(a)
    head = samples(next(it) for _ in range(5))
    state = a.state_dict()
    del it, a
    # the first loader's transfers in flight end at its close (gc: the loader's cycles), and
    # nginx logs them then: wait for its log to settle, or they count as the resumed epoch's
    import gc
    import time
    gc.collect()
    mark, t_end = -1, time.monotonic() + 5
    while time.monotonic() < t_end and mark != len(S.access_log(ngdir)):
        mark = len(S.access_log(ngdir))
        time.sleep(0.2)
    b = mk()
    b.load_state_dict(state)
    rest = samples(b)
    del b
    rows = S.access_log(ngdir)[mark:]
    T.check(head + rest == full and len(full) == NSHARDS * PER,
            "resumed after 5 batches (%s): %s, uninterrupted %s" % (state, head + rest, full))
    T.check(len(rows) == NSHARDS + 1, "requests of the resumed epoch: %d: %s" % (
        len(rows), [r[4] for r in rows]))

    # --- a missing shard (404): the error names the URL and the status; skip goes on ----------
    more = "tar:%sshard-{000000..%06d}.tar%s" % (base, NSHARDS, OPTS)
    url = base + "shard-%06d.tar" % NSHARDS
    rc, out, _ = load(more, "--workers", "2")
    T.check(rc == 1 and url in out["error"] and "HTTP 404" in out["error"], "404: %s" % out)
    rc, out, _ = load(more, "--workers", "2", "--on-error=skip")
    q = json.dumps(out.get("quarantine"))
    T.check(rc == 0 and out["samples"] == NSHARDS * PER and out["content_hash"] == m["content_hash"]
            and url in q and "HTTP 404" in q, "404 skipped: %s %s" % (R.summary(out), q))

    # --- a member whose size is 2^63 - 1 (base-256 in its header): a format error; the
    # window's doubling wrapped to 0 and the stream spun at 100% CPU for ever ------------------
    hdr = bytearray(512)
    hdr[0:5] = b"a.txt"
    hdr[100:108] = b"0000644\0"
    hdr[124:136] = b"\x80" + (2 ** 63 - 1).to_bytes(11, "big")
    hdr[136:148] = b"00000000000\0"
    hdr[156:157] = b"0"
    hdr[257:263] = b"ustar\0"
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    with open(os.path.join(root, "huge.tar"), "wb") as f:
        f.write(bytes(hdr) + bytes(2048))
    rc, out, err = load("tar:%shuge.tar,mode=stream" % base, "--workers", "1", timeout=60)
    T.check(rc == 1 and "more than a stream's window holds" in out.get("error", ""),
            "a member of 2^63 - 1 bytes: %s" % out.get("error"))

    # --- faults: 503s retried, cut bodies and resets resumed by range: every sample once -------
    fs = S.start_fault_server(root, work)
    servers.append(fs)
    for fault in ("503", "cut", "reset"):  # (a fault server counts each path's requests)
        same_as_local(fs.url(fault + "/1/"), fault + "/1", workers=2, epoch=1)
        mode = fault + "/2"
        rc, out, err = load("tar:%s%s%s" % (fs.url(mode + "/"), RNG, OPTS), "--workers", "2",
                            "--no-hash")
        T.check(rc == 0 and out["samples"] == NSHARDS * PER
                and out["remote"]["retries"] >= NSHARDS, "%s: %s %s" % (
                    mode, {k: out.get(k) for k in ("samples", "remote", "error")}, err[-500:]))
    # --- chunks: a cap of 1 MiB ahead makes 64 KiB chunks (cap / (2 x 8 connections)): each
    # shard asked for range by range, every byte once; the samples as the local stream's, also
    # through faults, from a server that ignores ranges (a chunk's 200 takes the whole file), and
    # a shard that shrinks between its chunks fails (the later chunk's size differs) -----------
    CH = 64 << 10
    os.environ["STOKE_STREAM_AHEAD"] = "1M"
    for w in (0, 2):
        same_as_local(base, "chunks", workers=w, epoch=1)
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2", "--no-hash")
    rows = S.access_log(ngdir)[mark:]
    want = []
    for p in paths:
        size = os.path.getsize(p)
        T.check(size > 3 * CH, "shard %s: %d bytes, not several chunks" % (p, size))
        want += [("/" + os.path.basename(p), "bytes=%d-%d" % (a, (min(a + CH, size) if a else CH) - 1))
                 for a in range(0, size, CH)]
    T.check(rc == 0 and out["samples"] == NSHARDS * PER and all(r[2] == 206 for r in rows),
            "chunked: %s %s" % (rows, err[-300:]))
    open_and_reuse(rows, want, "chunked")
    T.check(out["remote"]["requests"] == len(rows), "chunks: counters %s" % out["remote"])
    rc, out, _ = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2")
    T.check(rc == 0 and out["content_hash"] == m["content_hash"]
            and out["samples"] == m["samples"], "chunks, CLI: %s" % R.summary(out))
    for fault in ("503/1", "cut/1", "reset/1", "cut/3", "norange/0"):
        same_as_local(fs.url(fault + "/"), "chunks, " + fault, workers=2, epoch=1)
    rc, out, _ = load("tar:%s%s%s" % (fs.url("shrink/3/"), RNG, OPTS), "--workers", "2")
    T.check(rc == 1 and "the file changed while it was read" in out.get("error", "")
            and fs.url("shrink/3/") in out["error"], "chunks, shrink/3: %s" % out)
    del os.environ["STOKE_STREAM_AHEAD"]

    # a cut body is continued from its first missing byte, not fetched again
    resumed = [ln for ln in fs.log().splitlines()
               if "/cut/2/" in ln and ln.startswith("bytes=") and not ln.startswith("bytes=0-")]
    T.check(len(resumed) >= NSHARDS, "cut/2: no request resumed by range: %s" % fs.log()[-800:])
    rc, out, _ = load("tar:%s%s%s" % (fs.url("cut/3/"), RNG, OPTS), "--workers", "2")
    T.check(rc == 0 and out["content_hash"] == m["content_hash"], "cut/3: %s" % R.summary(out))

    # --- read-ahead: behind a limit per connection (limit_rate), a worker's next shards are
    # fetched while it reads one (nginx's times of each request: how many ran at once; no
    # timing asserted); STOKE_REMOTE_CONNECTIONS=0, one at a time; a cap of bytes ahead below a
    # shard's size, and an epoch left with transfers in flight, the same samples ---------------
    sdir = os.path.join(work, "nginx-slow")
    slow = S.start_nginx(root, sdir, extra="limit_rate 4m;")
    servers.append(slow)
    sspec = "tar:%s%s%s" % (slow.url(""), RNG, OPTS)
    cases = [(None, "threads", 3), ("0", "threads", 1)]
    for conns, mode, want in cases:
        mark = len(S.timings(sdir))
        env = {"STOKE_REMOTE_CONNECTIONS": conns} if conns else {}
        what = "STOKE_REMOTE_CONNECTIONS=%s, 1 worker %s" % (conns, mode)
        rc, out, err = load(sspec, "--workers", "1", "--epochs", "1", "--worker-mode=" + mode,
                            env=env)
        T.check(rc == 0 and out["content_hash"] == m["content_hash"]
                and out["samples"] == NSHARDS * PER, "%s: %s %s" % (what, out, err[-800:]))
        trows = [r for r in S.timings(sdir)[mark:] if r[4].endswith(".tar")]
        # the open's, then each shard once in the timed pass and once in the hash pass
        T.check(len(trows) == 2 * NSHARDS + 1, "%s: one request per shard: %s" % (what, trows))
        # the worker's requests (the open's, of the first shard, came before them)
        most = S.most_at_once(sorted(trows)[1:])
        T.check(most == want if want == 1 else most >= want,
                "%s: %d transfers at once (%s wanted): %s" % (what, most, want, trows))
    # the transfers ahead live in the worker's thread: worker processes are refused
    rc, out, _ = load(sspec, "--workers", "1", "--worker-mode=processes")
    T.check(rc == 1 and out.get("error_name") == "STOKE_ENOTSUP"
            and "worker threads" in out["error"], "processes: %s" % out)
    os.environ["STOKE_STREAM_AHEAD"] = "64K"  # below a shard's size: paused, resumed
    same_as_local(slow.url(""), "STOKE_STREAM_AHEAD=64K", workers=1, epoch=1)
    del os.environ["STOKE_STREAM_AHEAD"]
    # caps under a chunk: every lane paused at every read.  0, 1 and 16K hung for ever (the
    # open's drain of its first chunk paused on bytes nobody read: the 60 s timeout fails
    # them); the second a paused read slept in the poll with its bytes queued (63K: 50 times
    # the default's time) is not timed here (bench/, docs/bench.md)
    for env in ({"STOKE_STREAM_AHEAD": "0"}, {"STOKE_STREAM_AHEAD": "1"},
                {"STOKE_STREAM_AHEAD": "16K"},
                {"STOKE_REMOTE_CONNECTIONS": "0", "STOKE_STREAM_AHEAD": "64K"}):
        rc, out, err = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2", env=env,
                            timeout=60)
        T.check(rc == 0 and out["content_hash"] == m["content_hash"]
                and out["samples"] == NSHARDS * PER, "%s: %s %s" % (env, R.summary(out),
                                                                     err[-400:]))
    left = R.stream_after_abandon(sspec + ",shuffle_buffer=2", ids)
    T.check(left == R.stream_epoch(LOCAL + ",shuffle_buffer=2", ids, epoch=1, workers=2),
            "limit_rate: epoch 1 after epoch 0 was left half way differs")

    # --- through the cache: the same samples; each shard downloaded once ----------------------
    os.environ["STOKE_CACHE_DIR"] = os.path.join(work, "cache")
    same_as_local(base, "cache", workers=2, epoch=1)
    rc, out, _ = load("tar:%s%s%s" % (base, RNG, OPTS), "--workers", "2",
                      env={"STOKE_CACHE_DIR": os.path.join(work, "cache2")})
    T.check(rc == 0 and out["remote"]["cache_misses"] == NSHARDS
            and out["content_hash"] == m["content_hash"], "cache: %s" % out.get("remote"))
    del os.environ["STOKE_CACHE_DIR"]
    # behind limit_rate, a worker's next shards downloaded into the cache while it reads one
    mark = len(S.timings(sdir))
    rc, out, _ = load(sspec, "--workers", "1", "--no-hash",
                      env={"STOKE_CACHE_DIR": os.path.join(work, "cache3")})
    trows = [r for r in S.timings(sdir)[mark:] if r[4].endswith(".tar")]
    T.check(rc == 0 and out["samples"] == NSHARDS * PER
            and out["remote"]["cache_misses"] == NSHARDS, "cache, limited: %s" % out)
    T.check(sorted(r[4] for r in trows) == ["/shard-%06d.tar" % i for i in range(NSHARDS)]
            and S.most_at_once(trows) >= 2, "cache, limited: downloads %s" % trows)
finally:
    for srv in servers:
        srv.stop()
print("tar streaming over http: ok")
