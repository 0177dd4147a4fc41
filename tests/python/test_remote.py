"""Remote tar shards over HTTP (docs/sources.md, "Remote shards"), against real servers on
127.0.0.1 started here: nginx (Debian nginx-light) serving generated shards, the same nginx
with TLS, and tests/remote/fault_server.py injecting faults.  Every remote run is compared with
the same shards read from disk through the CLI: samples, content_hash (field 0: each field
comes first in one of the runs), order_hash and index_sum.  Skips (77) when nginx or the
build's libcurl is missing, saying why.  STOKE_TEST_TIMES=1 prints each CLI run's time."""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import servers as S  # noqa: E402

import runs as R  # noqa: E402
from runs import load  # noqa: E402

CLI = R.need_cli()
NSHARDS = 4
RANGE = "shard-{000000..%06d}.tar" % (NSHARDS - 1)
ORDERS = R.ORDERS
WINDOW = 1 << 20  # the first window of a remote shard's walk (no sidecar index)


def same_as_local(base, local_root, what, *args, env=None, orders=ORDERS, samples=NSHARDS * 12):
    R.same_as_local(base, local_root, RANGE, what, *args, env=env, orders=orders,
                    samples=samples)


work = T.tmpdir()
root = os.path.join(work, "root")
paths, offsets = S.make_shards(root, nshards=NSHARDS)
sizes = []  # per shard, {key: size of its .txt member}
for p in paths:
    with tarfile.open(p) as tf:
        sizes.append({m.name[:-4]: m.size for m in tf.getmembers() if m.name.endswith(".txt")})
first = "tar:http://127.0.0.1:1/" + RANGE


def span(sh, i):
    """Sample i of shard sh: its first byte (.bin) and its last (.txt)."""
    key = "s%03d_%03d" % (sh, i)
    return offsets[sh][key + ".bin"], offsets[sh][key + ".txt"] + sizes[sh][key] - 1


def sample_runs(rows, sh, what):
    """The range requests of shard sh in nginx's rows that start at a sample's first byte
    (not the walk's windows) as runs (a, b) of whole samples a .. b-1, sorted; checks that
    each ends where a sample does and that every sample is in exactly two (the timed pass's
    and the hash pass's)."""
    spans = [span(sh, i) for i in range(12)]
    firsts = [a for a, _ in spans]
    got = sorted(tuple(int(x) for x in r[3][len("bytes="):].split("-")) for r in rows
                 if r[4] == "/shard-%06d.tar" % sh and r[3].startswith("bytes=")
                 and int(r[3][len("bytes="):].split("-")[0]) in firsts)
    runs = []
    for lo, hi in got:
        a = firsts.index(lo)
        b = next((k + 1 for k in range(a, 12) if spans[k][1] == hi), None)
        T.check(b is not None, "%s: shard %d: bytes=%d-%d ends inside a sample"
                % (what, sh, lo, hi))
        runs.append((a, b))
    cover = sorted(k for a, b in runs for k in range(a, b))
    T.check(cover == sorted(list(range(12)) * 2),
            "%s: shard %d: the requests' samples %s" % (what, sh, runs))
    return runs

R.refused_without_libcurl(first)

try:
    ng = S.start_nginx(root, os.path.join(work, "nginx"))
except S.Unavailable as e:
    T.skip(str(e))
servers = [ng]
try:
    base = ng.url("")
    # --- the progress bar (on a terminal only) shows the network's counters ---------------
    import pty
    mfd, sfd = pty.openpty()
    p = subprocess.Popen([CLI, "load", "tar:%s%s,fields=bin:cls" % (base, RANGE), "--no-hash",
                          "--batch-size", "4", "--no-pin-memory"], stdout=subprocess.DEVNULL,
                         stderr=sfd, env={k: v for k, v in os.environ.items()
                                          if k not in R.CACHE_ENV})
    os.close(sfd)
    tty = b""
    while True:
        try:
            chunk = os.read(mfd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        tty += chunk
    os.close(mfd)
    T.check(p.wait(timeout=60) == 0, "stoke load on a terminal: %r" % tty[-300:])
    bars = re.findall(rb"network ([0-9.]+) MB, ([0-9]+) requests, ([0-9]+) retries, "
                      rb"[0-9.]+ s waited", tty)
    T.check(bars and float(bars[-1][0]) > 0 and int(bars[-1][1]) >= NSHARDS
            and int(bars[-1][2]) == 0, "the progress bar's network counters: %r" % tty[-400:])

    # --- equal to the local shards: 0 and 2 workers, shuffled, two ranks -------------------
    same_as_local(base, root, "nginx", "--workers", "0")
    same_as_local(base, root, "nginx", "--workers", "2", "--shuffle", "--seed", "11")
    # worker processes: each drops the handles it inherited (fork hooks) and connects anew
    if not os.environ.get("STOKE_PY_TSAN"):  # TSan's lock detector: not across this fork
        same_as_local(base, root, "nginx, worker processes", "--workers", "2", "--shuffle",
                      "--worker-mode=processes", orders=ORDERS[1:2])
    else:
        print("not run under TSan: the worker-process case (%s)" % os.environ["STOKE_PY_TSAN"])
    for rank in ("0", "1"):  # both runs, local and remote, as rank R of 2
        os.environ.update(RANK=rank, WORLD_SIZE="2")
        same_as_local(base, root, "nginx rank " + rank, "--workers", "2", "--shuffle",
                      "--distributed", orders=ORDERS[:1], samples=NSHARDS * 6)
    del os.environ["RANK"], os.environ["WORLD_SIZE"]

    # --- keep-alive: one connection per worker slot, not one per request ---------------------
    before = len(S.access_log(os.path.join(work, "nginx")))
    rc, out, err = load("tar:%s%s,fields=txt:bin:cls,ragged=txt" % (base, RANGE), "--workers",
                        "2")
    rows = S.access_log(os.path.join(work, "nginx"))[before:]
    # no sidecar index here (test_remote_index.py): one 404 for each shard's URL.idx at open,
    # asked for at once (a connection each: STOKE_REMOTE_CONNECTIONS is 8)
    idx = [r for r in rows if r[4].endswith(".idx")]
    T.check(sorted(r[4] for r in idx) == ["/shard-%06d.tar.idx" % i for i in range(NSHARDS)]
            and all(r[2] == 404 for r in idx) and len({r[0] for r in idx}) == NSHARDS,
            "index requests: %s" % idx)
    rows = [r for r in rows if not r[4].endswith(".idx")]
    conns = {r[0] for r in rows}
    rem = out["remote"]
    T.check(rem and rem["shards"] == NSHARDS and rem["cached"] is False
            and rem["cache_misses"] == 0 and rem["retries"] == 0
            and 0 < rem["requests"] <= len(rows) + len(idx) and rem["bytes"] > 0
            and rem["network_wait_s"] > 0, "counters: %s" % rem)
    T.check(rc == 0, "load: %s" % err)
    # coalescing: each sample's three members in one request (with its neighbours in the batch
    # at times: below), in the timed pass and the hash pass, never a request of its own for
    # the cls or txt member
    starts = {}
    for r in rows:
        a, b = r[3][len("bytes="):].split("-")
        starts.setdefault(r[4], []).append((int(a), int(b)))
    for sh in range(NSHARDS):
        sample_runs(rows, sh, "keep-alive run")
        got = starts.get("/shard-%06d.tar" % sh, [])
        for i in range(12):
            key = "s%03d_%03d" % (sh, i)
            T.check(not any(a in (offsets[sh][key + ".cls"], offsets[sh][key + ".txt"])
                            for a, _ in got), "shard %d sample %d: a member on its own" % (sh, i))
    # each worker's batch has up to STOKE_REMOTE_CONNECTIONS (8) requests in flight, each on a
    # connection of its own that later batches reuse: a connection serves many requests
    T.check(len(rows) >= 4 * len(conns),
            "%d requests on %d connections: no keep-alive" % (len(rows), len(conns)))

    # --- neighbours share a request: a batch's samples next to each other in a shard go in
    # requests of whole samples, in the shard's order, each closed once it holds the batch's
    # bytes / (4 x STOKE_REMOTE_CONNECTIONS) (every connection keeps a few) --------------------
    for conns_env, conns in (("0", 1), ("2", 2)):
        mark = len(S.access_log(os.path.join(work, "nginx")))
        what = "neighbours, STOKE_REMOTE_CONNECTIONS=" + conns_env
        # batch 12, sequential: each batch is one shard's 12 samples (timed pass, hash pass)
        same_as_local(base, root, what, "--workers", "0", "--batch-size", "12",
                      orders=ORDERS[:1], env={"STOKE_REMOTE_CONNECTIONS": conns_env})
        nrows = S.access_log(os.path.join(work, "nginx"))[mark:]
        for sh in range(NSHARDS):
            spans = [span(sh, i) for i in range(12)]
            runs = sample_runs(nrows, sh, what)
            n = sum(spans[k][1] - spans[k][0] + 1 for k in range(12))
            share = -(-n // (4 * conns))
            T.check(len(runs) <= 2 * 4 * conns and len(runs) < 24 and all(
                sum(spans[k][1] - spans[k][0] + 1 for k in range(a, b - 1)) < share
                for a, b in runs),
                    "%s: shard %d: requests of samples %s (bytes %d)" % (what, sh, runs, n))

    # --- a batch's requests in flight together: nginx limited per connection, the request times
    # of its log show how many ran at once (no timing is asserted, only overlap) --------------
    sdir = os.path.join(work, "nginx-slow")
    slow = S.start_nginx(root, sdir, extra="limit_rate 4m;")
    servers.append(slow)
    for conns_env, want in (("4", 4), ("0", 1)):
        mark = len(S.timings(sdir))
        what = "range reads, STOKE_REMOTE_CONNECTIONS=%s" % conns_env
        R.same_as_local(slow.url(""), root, RANGE, what, "--workers", "0", "--batch-size", "8",
                        orders=ORDERS[:1], env={"STOKE_REMOTE_CONNECTIONS": conns_env})
        trows = [r for r in S.timings(sdir)[mark:] if r[4].endswith(".tar")]
        most = S.most_at_once(trows)
        T.check(most == want if want == 1 else most >= want - 1,
                "%s: %d requests at once (%d wanted): %s" % (what, most, want, trows))
        # the open walks the shards' headers together (no sidecar index): their first windows
        # (bytes=0-1048575, the access log's rows in the timing log's order) run at once
        arows = S.access_log(sdir)[mark:]
        first = [t for t, a in zip(S.timings(sdir)[mark:], arows)
                 if a[4].endswith(".tar") and a[3] == "bytes=0-%d" % (WINDOW - 1)]
        most = S.most_at_once(first)
        T.check(len(first) == NSHARDS * len(ORDERS[:1])
                and (most == 1 if want == 1 else most >= want - 1),
                "%s: the walks' first windows, %d at once (%d wanted): %s"
                % (what, most, want, first))
    # pax records longer than the walk's windows (4 KiB here: 4 MB/s a connection), members
    # longer too: a window from the member's pax header to its own header (a window from the
    # read that waited alone livelocked), the same samples
    import io
    import random
    paxd = os.path.join(root, "pax")
    os.makedirs(paxd)
    rnd = random.Random(4)
    for sh in range(2):
        with tarfile.open(os.path.join(paxd, "p-%d.tar" % sh), "w",
                          format=tarfile.PAX_FORMAT) as tf:
            for i in range(20):  # 1.2 MB: past the first window
                for ext, data in (("txt", rnd.randbytes(rnd.choice([100, 70000]))),
                                  ("cls", b"%d" % i)):
                    ti = tarfile.TarInfo("k%d_%02d.%s" % (sh, i, ext))
                    ti.size = len(data)
                    ti.pax_headers = {"comment": "c" * rnd.choice([10, 9000, 30000])}
                    tf.addfile(ti, io.BytesIO(data))
    R.same_as_local(slow.url("pax/"), paxd, "p-{0..1}.tar", "long pax records", "--workers", "2",
                    orders=["txt:cls", "cls:txt"], samples=40)
    T.check(all(r[2] == 206 and r[3].startswith("bytes=") for r in rows),
            "not all range requests answered 206: %s" % [r for r in rows if r[2] != 206][:3])

    # --- a missing shard: the open fails naming the URL and the status ------------------------
    url4 = base + "shard-000004.tar"
    rc, out, err = load("tar:%sshard-{000000..000004}.tar" % base)
    T.check(rc == 1 and url4 in out["error"] and "HTTP 404" in out["error"],
            "a missing shard: %s" % out["error"])

    # --- many shards without sidecar indexes, walked together at open ------------------------
    # 40 small shards (more than the 32 walked at a time), some with a sidecar index among
    # them: the members in shard order whichever way each shard was opened
    many = os.path.join(root, "many")
    S.make_shards(many, nshards=40, per_shard=3, seed=9, big=3000)
    MANY = "shard-{000000..000039}.tar"
    idxd = os.path.join(work, "many-idx")
    shutil.copytree(many, idxd)
    p = subprocess.run([CLI, "index", "tar:%s/%s" % (idxd, MANY)], capture_output=True,
                       text=True, timeout=120)
    T.check(p.returncode == 0, "stoke index: %s" % p.stderr)
    for i in (0, 5, 6, 7, 20, 33, 39):
        shutil.copy(os.path.join(idxd, "shard-%06d.tar.idx" % i), many)
    for w in ("0", "2"):
        R.same_as_local(base + "many/", many, MANY, "40 shards, 7 indexed, workers " + w,
                        "--workers", w, "--shuffle", orders=ORDERS[:1], samples=120)
    for f in os.listdir(many):
        if f.endswith(".idx"):
            os.remove(os.path.join(many, f))
    R.same_as_local(base + "many/", many, MANY, "40 shards, none indexed", "--workers", "2",
                    orders=ORDERS[1:2], samples=120)

    # a corrupt header found late in its walk (past the first window), a truncated shard and a
    # missing one after it: the error is the first shard's in order, naming its URL and byte
    bad = os.path.join(root, "bad")
    bpaths, _ = S.make_shards(bad, nshards=8, seed=12)
    with tarfile.open(bpaths[3]) as tf:  # 1.9 MB (seed 12)
        late = [m.offset for m in tf.getmembers() if m.offset > WINDOW][0]
    with open(bpaths[3], "r+b") as f:  # a byte of the member's name: a bad checksum
        f.seek(late + 3)
        c = f.read(1)
        f.seek(late + 3)
        f.write(bytes([c[0] ^ 0x20]))
    with tarfile.open(bpaths[5]) as tf:
        cut = [m.offset_data for m in tf.getmembers()][20] + 100
    os.truncate(bpaths[5], cut)  # the end inside a member's data
    os.remove(bpaths[6])
    BAD = "shard-{000000..000007}.tar"
    rc, out, err = load("tar:%sbad/%s" % (base, BAD), "--workers", "0")
    want = "tar %sbad/shard-000003.tar: at byte %d: bad header checksum" % (base, late)
    T.check(rc == 1 and want in out["error"] and out["error_name"] == "STOKE_EFORMAT",
            "a corrupt header late in shard 3: %s (wanted %r)" % (out.get("error"), want))
    rc, out, err = load("tar:%sbad/shard-{000004..000007}.tar" % base, "--workers", "2")
    want = "tar %sbad/shard-000005.tar: at byte" % base
    T.check(rc == 1 and want in out["error"] and "truncated" in out["error"]
            and "ends at byte %d" % cut in out["error"],
            "a truncated shard 5: %s" % out.get("error"))
    rc, out, err = load("tar:%sbad/shard-{000006..000007}.tar" % base)
    T.check(rc == 1 and base + "bad/shard-000006.tar" in out["error"]
            and "HTTP 404" in out["error"] and out["error_name"] == "STOKE_ENOENT",
            "a missing shard among the walked: %s" % out.get("error"))
    # a missing shard among many walked: its URL and the 404, also with another after it
    os.remove(os.path.join(many, "shard-000017.tar"))
    rc, out, err = load("tar:%smany/%s" % (base, MANY), "--workers", "2")
    T.check(rc == 1 and "GET %smany/shard-000017.tar: HTTP 404" % base in out["error"]
            and out["error_name"] == "STOKE_ENOENT", "shard 17 of 40 missing: %s" % out.get("error"))
    os.remove(os.path.join(many, "shard-000030.tar"))
    rc, out, err = load("tar:%smany/%s" % (base, MANY), "--workers", "0")
    T.check(rc == 1 and "GET %smany/shard-000017.tar: HTTP 404" % base in out["error"],
            "shards 17 and 30 of 40 missing: %s" % out.get("error"))

    # --- TLS: verified by default, trusted with STOKE_CA_BUNDLE -------------------------------
    try:
        cert, key = S.make_cert(work)
        tls = S.start_nginx(root, os.path.join(work, "nginx-tls"), tls=(cert, key))
        servers.append(tls)
    except (S.Unavailable, subprocess.CalledProcessError) as e:
        print("TLS part not run:", e)
        tls = None
    if tls:
        rc, out, err = load("tar:%s%s" % (tls.url(""), RANGE))
        T.check(rc == 1 and "certificate" in out["error"].lower(),
                "a self-signed server was not refused: %s" % out)
        same_as_local(tls.url(""), root, "https", "--workers", "2", orders=ORDERS[:1],
                      env={"STOKE_CA_BUNDLE": cert})

    # --- faults (fault_server.py): retried, resumed, or a bad sample --------------------------
    fs = S.start_fault_server(root, work)
    servers.append(fs)
    fast = {"STOKE_LOG": "debug"}
    for mode in ("503/2", "cut/1", "reset/1"):
        same_as_local(fs.url(mode + "/"), root, mode, "--workers", "2", orders=ORDERS[:1],
                      env=fast)
    # an S3 request follows no redirect: libcurl sent the session token's header (which it
    # does not drop as it drops Authorization) to the host redirected to
    s3 = {"AWS_ENDPOINT_URL": fs.url("moved/0"), "AWS_ACCESS_KEY_ID": "AKIDTEST",
          "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "TOKEN", "AWS_REGION":
          "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    rc, out, err = load("tar:s3://bucket/shard-000000.tar", env=s3)
    T.check(rc == 1 and "HTTP 307: a redirect, which an S3 request does not follow"
            in out["error"] and "TOKEN" not in out["error"], "an S3 redirect: %s" % out["error"])
    stats = json.loads(subprocess.run(["curl", "-s", fs.url("__stats")], capture_output=True,
                                      env=S.server_env(),
                                      text=True).stdout) if shutil.which("curl") else None
    if stats is not None:
        T.check(not [k for k in stats if k.startswith("/ok/0/bucket/")],
                "an S3 redirect was followed: %s" % stats)
        for s in range(NSHARDS):
            n = stats.get("/503/2/shard-%06d.tar" % s, 0)
            T.check(n >= 3, "shard %d: %d requests through 503/2 (2 refused, then served)" % (s, n))
    # (counted per path: cut/3 is a fresh one) the first 3 answers of each shard cut short
    rc, out, err = load("tar:%s%s,fields=txt:bin:cls,ragged=txt" % (fs.url("cut/3/"), RANGE),
                        "--workers", "0", env=fast)
    m = re.search(r"remote: (\d+) request\(s\), (\d+) retr", err)
    T.check(rc == 0 and m and int(m.group(2)) >= 3 * NSHARDS,
            "cut/3: retries %s: %s" % (m and m.groups(), err[-2000:]))

    # a shard that shrinks while the open walks its headers (no sidecar index): an error that
    # says so and names the URL, not the same short request forever
    grow = os.path.join(root, "grow")
    os.makedirs(grow, exist_ok=True)
    with tarfile.open(os.path.join(grow, "g.tar"), "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(40):
            m = tarfile.TarInfo("k%03d.bin" % i)
            m.size = 100 << 10
            t.addfile(m, io.BytesIO(bytes(m.size)))
    url = fs.url("shrink/1/grow/g.tar")
    rc, out, err = load("tar:%s,fields=bin" % url, "--workers", "0")
    T.check(rc == 1 and url in out["error"] and "changed while its headers were read"
            in out["error"], "a shard that shrank: %s %s" % (out.get("error"), err[-300:]))

    # a member that always fails: the sample's error names the URL and the status; skip goes on
    off = offsets[1]["s001_003.bin"]  # where the sample's one request starts
    bad = fs.url("failat/%d/" % off)
    env = {"STOKE_REMOTE_RETRIES": "2"}
    rc, out, err = load("tar:%s%s,fields=txt:bin:cls,ragged=txt" % (bad, RANGE), "--workers", "2",
                        env=env)
    T.check(rc == 1 and bad + "shard-000001.tar" in out["error"] and "HTTP 500" in out["error"]
            and "after 3 tries" in out["error"], "a failing member: %s" % out["error"])
    rc, out, err = load("tar:%s%s,fields=txt:bin:cls,ragged=txt" % (bad, RANGE), "--workers", "2",
                        "--on-error=skip", env=env)
    T.check(rc == 0 and out["samples"] == NSHARDS * 12 - 1 and out["skipped_samples"] == 1,
            "on_error=skip: %s" % {k: out.get(k) for k in ("samples", "skipped_samples", "error")})
    q = json.dumps(out["quarantine"])
    T.check("shard-000001.tar" in q and "HTTP 500" in q and "InternalError" in q,
            "quarantine: %s" % q)
    # STOKE_REMOTE_TIMEOUT=0 is taken as 1 s, with a warning (it was silent)
    rc, out, err = load("tar:%s%s,fields=txt:bin:cls,ragged=txt" % (base, RANGE), "--workers",
                        "0", env={"STOKE_REMOTE_TIMEOUT": "0"})
    T.check(rc == 0 and "STOKE_REMOTE_TIMEOUT=0: a try needs a second at least: using 1" in err,
            "STOKE_REMOTE_TIMEOUT=0: %s %s" % (out.get("error"), err[-300:]))
finally:
    for s in servers:
        s.stop()
print("remote over http: ok")
