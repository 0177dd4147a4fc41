"""Sidecar indexes of remote tar shards (docs/sources.md, "Sidecar indexes"; docs/cli.md,
"stoke index"), against nginx on 127.0.0.1 started here: `stoke index` writes SHARD.idx next to
each local shard; a remote tar source fetches URL.idx (one request per shard) instead of
walking the shard in 1 MiB windows, with the same samples as the local source; without an index
(404) it walks the shard as before, saying nothing; a stale index (the shard rewritten after
indexing: another size) fails the sample's read naming the index; a malformed one fails the
open naming it; with zlib the index carries the shard's CRC-32 (version 2) and the cache
refuses a download that does not match it (a shard rewritten to the same size), while a
version 1 index (no checksum) still works.  Skips (77) when nginx or the build's libcurl is
missing."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zlib

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import servers as S  # noqa: E402

import runs as R  # noqa: E402
from runs import load  # noqa: E402

CLI = R.need_cli_and_libcurl()
ZLIB = "zlib" in os.environ.get("STOKE_BUILD_FEATURES", "zlib").split(",")
NSHARDS = 3
RANGE = "shard-{000000..%06d}.tar" % (NSHARDS - 1)
WINDOW = 1 << 20  # the tar source's window when it walks a remote shard


def index(spec, *args):
    p = subprocess.run([CLI, "index", spec] + list(args), capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def same_as_local(base, root, what, *args):
    R.same_as_local(base, root, RANGE, what, *args, orders=R.ORDERS[:2],
                    samples=NSHARDS * 12)


def window_reads(rows):
    """Requests of a shard (not its index) for a whole window: the walk's."""
    out = []
    for r in rows:
        if r[4].endswith(".tar") and r[3].startswith("bytes="):
            a, b = r[3][len("bytes="):].split("-")
            if b and int(b) - int(a) + 1 == WINDOW:
                out.append(r)
    return out


work = T.tmpdir()
root = os.path.join(work, "root")    # indexed
plain = os.path.join(work, "plain")  # the same shards without indexes
S.make_shards(root, nshards=NSHARDS)
shutil.copytree(root, plain)

# --- stoke index: one SHARD.idx per shard, atomically (no temporary left) -------------------
rc, out, err = index("tar:%s/%s" % (root, RANGE), "--json")
T.check(rc == 0, "stoke index: %s %s" % (out, err))
res = json.loads(out)
T.check(res["ok"] is True and res["count"] == NSHARDS and res["members"] == NSHARDS * 12 * 3
        and [os.path.basename(s["shard"]) for s in res["shards"]]
        == ["shard-%06d.tar" % i for i in range(NSHARDS)]
        and all(s["members"] == 36 and s["bytes"] == os.path.getsize(s["shard"])
                for s in res["shards"]), "stoke index --json: %s" % res)
T.check(sorted(os.listdir(root)) == sorted(["shard-%06d.tar" % i for i in range(NSHARDS)]
                                           + ["shard-%06d.tar.idx" % i for i in range(NSHARDS)]),
        "files after stoke index: %s" % os.listdir(root))
with open(os.path.join(root, "shard-000000.tar.idx"), "rb") as f:
    head = f.read().split(b"\n")
with open(os.path.join(root, "shard-000000.tar"), "rb") as f:
    crc = zlib.crc32(f.read())
if ZLIB:  # version 2: the shard's CRC-32 after its size
    T.check(head[0] == b"stoke-tar-index 2" and head[2] == b"shard-crc32 %08x" % crc
            and head[3] == b"members 36", "index format: %r, crc %08x" % (head[:4], crc))
    head = head[:2] + head[3:]
else:
    T.check(head[0] == b"stoke-tar-index 1", "index format: %r" % head[:4])
T.check(head[1] == b"shard-bytes %d" % os.path.getsize(os.path.join(root, "shard-000000.tar"))
        and head[2] == b"members 36" and head[-2] == b"end" and head[-1] == b"",
        "index format: %r" % head[:4])
rc, out2, err = index("tar:%s/%s" % (root, RANGE))  # text; indexing again replaces them
T.check(rc == 0 and "3 shards indexed, 108 members" in out2, "stoke index: %r %r" % (out2, err))
# refusals: a URL, options, a corrupt shard, nothing matching
rc, out, err = index("tar:http://127.0.0.1:1/a.tar", "--json")
T.check(rc == 1 and "is remote" in json.loads(out)["error"], "a URL: %s %s" % (out, err))
rc, out, err = index("tar:%s/%s,fields=txt" % (root, RANGE))
T.check(rc == 2 and "no options" in err, "options: %s %s" % (out, err))
# a brace list's commas are the pattern's, not options (refused as options before)
rc, out, err = index("tar:%s/shard-00000{0,2}.tar" % root)
T.check(rc == 0 and "2 shards indexed" in out, "a brace list: %r %r" % (out, err))
rc, out, err = index("tar:%s/%s" % (root, RANGE), "--out")
T.check(rc == 2 and "--out needs a value" in err, "--out without DIR: %s %s" % (out, err))
rc, out, err = index("tar:%s/%s" % (root, RANGE), "--force")
T.check(rc == 2 and "unknown option '--force'" in err, "an unknown option: %s %s" % (out, err))
bad = os.path.join(work, "bad")
os.makedirs(bad)
with open(os.path.join(bad, "x.tar"), "wb") as f:
    f.write(b"not a tar" * 200)
rc, out, err = index("tar:%s/x.tar" % bad, "--json")
T.check(rc == 1 and "x.tar" in json.loads(out)["error"] and os.listdir(bad) == ["x.tar"],
        "a corrupt shard: %s %s %s" % (out, err, os.listdir(bad)))
# a corrupt shard after good ones: the JSON failure lists the shards indexed before it (they
# keep their index; the object said only the error), and stderr has the message too
import shutil  # noqa: E402
shutil.copy(os.path.join(root, "shard-000000.tar"), os.path.join(bad, "a.tar"))
rc, out, err = index("tar:%s/{a,x}.tar" % bad, "--json")
res = json.loads(out)
T.check(rc == 1 and res["ok"] is False and "x.tar" in res["error"]
        and res["error_name"] == "STOKE_EFORMAT" and res["count"] == 1
        and [s["shard"] for s in res["shards"]] == [os.path.join(bad, "a.tar")]
        and res["members"] == 36 and "x.tar" in err
        and sorted(os.listdir(bad)) == ["a.tar", "a.tar.idx", "x.tar"],
        "a corrupt shard after a good one: %s %s %s" % (out, err, os.listdir(bad)))
os.unlink(os.path.join(bad, "a.tar"))
os.unlink(os.path.join(bad, "a.tar.idx"))
rc, out, err = index("tar:%s/none-*.tar" % bad)
T.check(rc == 1 and "no file matches" in err, "no match: %s %s" % (out, err))

try:
    ng = S.start_nginx(work, os.path.join(work, "nginx"))
except S.Unavailable as e:
    T.skip(str(e))
ngdir = os.path.join(work, "nginx")
try:
    base = ng.url("root/")
    # --- stoke index --out DIR of shards already on the server: one download each, the same
    # bytes as the local shards' indexes, no temporary left; a 404 names the URL -------------
    outd = os.path.join(work, "fromhttp")
    os.makedirs(outd)
    mark = len(S.access_log(ngdir))
    rc, out, err = index("tar:%s%s" % (ng.url("plain/"), RANGE), "--out", outd, "--json")
    rows = S.access_log(ngdir)[mark:]
    res = json.loads(out)
    T.check(rc == 0 and res["count"] == NSHARDS and res["members"] == NSHARDS * 36
            and [s["shard"] for s in res["shards"]]
            == [ng.url("plain/shard-%06d.tar" % i) for i in range(NSHARDS)]
            and sorted(os.listdir(outd)) == ["shard-%06d.tar.idx" % i for i in range(NSHARDS)],
            "stoke index --out of URLs: %s %s %s" % (res, err, os.listdir(outd)))
    for i in range(NSHARDS):
        with open(os.path.join(outd, "shard-%06d.tar.idx" % i), "rb") as a, \
                open(os.path.join(root, "shard-%06d.tar.idx" % i), "rb") as b:
            T.check(a.read() == b.read(), "shard %d: the index from HTTP differs from the "
                    "local one" % i)
    T.check(sorted(r[4] for r in rows) == ["/plain/shard-%06d.tar" % i for i in range(NSHARDS)]
            and all(r[2] in (200, 206) for r in rows), "downloads: %s" % rows)
    rc, out, err = index("tar:%s" % ng.url("plain/shard-000009.tar"), "--out", outd, "--json")
    T.check(rc == 1 and "404" in json.loads(out)["error"]
            and "plain/shard-000009.tar" in json.loads(out)["error"]
            and len(os.listdir(outd)) == NSHARDS, "a 404: %s %s" % (out, os.listdir(outd)))
    rc, out, err = index("tar:%s" % ng.url("plain/shard-000000.tar"), "--out",
                         os.path.join(outd, "shard-000000.tar.idx"), "--json")
    T.check(rc == 1 and "is not a directory" in json.loads(out)["error"],
            "--out a file: %s" % out)
    # --- with indexes: equal to the local source, 0 and 2 workers ---------------------------
    same_as_local(base, root, "indexed", "--workers", "0")
    same_as_local(base, root, "indexed", "--workers", "2", "--shuffle", "--seed", "5")
    # one request per shard for its index, and no window of a shard read at open
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%s%s,fields=bin" % (base, RANGE), "--workers", "0", "--epochs", "1")
    rows = S.access_log(ngdir)[mark:]
    idx = [r for r in rows if r[4].endswith(".idx")]
    T.check(rc == 0 and sorted(r[4] for r in idx)
            == ["/root/shard-%06d.tar.idx" % i for i in range(NSHARDS)]
            and all(r[2] == 206 for r in idx), "index requests: %s (%s)" % (idx, err))
    T.check(not window_reads(rows), "window reads with an index: %s" % window_reads(rows)[:3])
    T.check(".idx" not in err, "stderr: %s" % err)
    # the indexes are fetched at once from shard 0 on (read_each: a connection each), with
    # STOKE_REMOTE_CONNECTIONS=0 one after another on one connection
    for conns, want in (("4", NSHARDS), ("0", 1)):
        mark = len(S.access_log(ngdir))
        rc, out, err = load("tar:%s%s,fields=bin" % (base, RANGE), "--workers", "0",
                            env={"STOKE_REMOTE_CONNECTIONS": conns})
        idx = [r for r in S.access_log(ngdir)[mark:] if r[4].endswith(".idx")]
        T.check(rc == 0 and sorted(r[4] for r in idx)
                == ["/root/shard-%06d.tar.idx" % i for i in range(NSHARDS)]
                and len({r[0] for r in idx}) == want,
                "indexes with STOKE_REMOTE_CONNECTIONS=%s: %s (%s)" % (conns, idx, err))
    # with the cache (STOKE_CACHE_DIR): the open takes the members from the indexes and
    # downloads nothing; the loads download each shard once, whole, in parallel, with the same
    # samples; a second run asks for nothing (not even the indexes)
    cenv = {"STOKE_CACHE_DIR": os.path.join(work, "cache")}
    mark = len(S.access_log(ngdir))
    R.same_as_local(base, root, RANGE, "indexed, cache", "--workers", "2", "--shuffle",
                    orders=R.ORDERS[:1], samples=NSHARDS * 12, env=cenv)
    rows = S.access_log(ngdir)[mark:]
    idx = [r for r in rows if r[4].endswith(".idx")]
    tars = [r for r in rows if r[4].endswith(".tar")]
    T.check(len(idx) == NSHARDS and all(r[2] == 206 for r in idx)
            and sorted(r[4] for r in tars) == ["/root/shard-%06d.tar" % i for i in range(NSHARDS)]
            and all(r[3].startswith("bytes=0-") for r in tars) and not window_reads(rows),
            "indexed, cache: %s" % rows)
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%s%s,fields=bin" % (base, RANGE), "--workers", "2", env=cenv)
    T.check(rc == 0 and S.access_log(ngdir)[mark:] == [] and out["remote"]["requests"] == 0,
            "indexed, cached: %s %s" % (S.access_log(ngdir)[mark:], out.get("remote")))
    # the URL's query string stays after .idx
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%sshard-000000.tar?v=1,fields=bin" % base, "--workers", "0")
    rows = S.access_log(ngdir)[mark:]
    T.check(rc == 0 and rows and rows[0][4] == "/root/shard-000000.tar.idx?v=1"
            and rows[0][2] == 206 and not window_reads(rows),
            "a query string: %s %s" % (rows[:2], out.get("error")))

    # many small members (an empty one per sample): more members than kilobytes
    dense = os.path.join(work, "dense")
    os.makedirs(dense)
    with tarfile.open(os.path.join(dense, "d.tar"), "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(40):
            for ext, data in (("cls", b"%d\n" % i), ("empty", b"")):
                ti = tarfile.TarInfo("k%03d.%s" % (i, ext))
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    T.check(index("tar:%s/d.tar" % dense)[0] == 0, "stoke index of d.tar")
    rc_l, loc, _ = load("tar:%s/d.tar,fields=cls" % dense)
    rc, rem, err = load("tar:%sd.tar,fields=cls" % ng.url("dense/"))
    T.check(rc_l == 0 and rc == 0 and loc["samples"] == 40 and R.summary(rem) == R.summary(loc),
            "dense shard: %s %s" % (rem.get("error"), R.summary(loc)))

    # --- without indexes: a 404 per shard, then the walk, silently --------------------------
    pbase = ng.url("plain/")
    same_as_local(pbase, plain, "not indexed", "--workers", "2", "--shuffle")
    mark = len(S.access_log(ngdir))
    rc, out, err = load("tar:%s%s,fields=bin" % (pbase, RANGE), "--workers", "0")
    rows = S.access_log(ngdir)[mark:]
    idx = [r for r in rows if r[4].endswith(".idx")]
    T.check(rc == 0 and sorted(r[4] for r in idx)
            == ["/plain/shard-%06d.tar.idx" % i for i in range(NSHARDS)]
            and all(r[2] == 404 for r in idx), "404s: %s (%s)" % (idx, err))
    T.check({r[4] for r in window_reads(rows)}
            == {"/plain/shard-%06d.tar" % i for i in range(NSHARDS)},
            "no walk without an index: %s" % rows[:6])
    T.check("idx" not in err and "warn" not in err.lower(), "stderr without an index: %s" % err)

    # --- a stale index: shard 1 rewritten after indexing (another size) ---------------------
    stale = os.path.join(work, "stale")
    shutil.copytree(root, stale)
    size_before = os.path.getsize(os.path.join(stale, "shard-000001.tar"))
    tmp = os.path.join(work, "other")
    others, _ = S.make_shards(tmp, nshards=2, seed=99)
    shutil.copy(others[1], os.path.join(stale, "shard-000001.tar"))
    T.check(os.path.getsize(os.path.join(stale, "shard-000001.tar")) != size_before,
            "the rewritten shard has the same size")
    sbase = ng.url("stale/")
    rc, out, err = load("tar:%s%s,fields=bin:txt,ragged=txt" % (sbase, RANGE), "--workers", "2")
    T.check(rc == 1 and sbase + "shard-000001.tar.idx" in out["error"]
            and "stale" in out["error"] and "stoke index" in out["error"],
            "a stale index: %s %s" % (out.get("error"), err))
    # indexed again: right again
    rc, _, err = index("tar:%s/shard-000001.tar" % stale)
    T.check(rc == 0, "index again: %s" % err)
    rc, out, err = load("tar:%s%s,fields=bin:txt,ragged=txt" % (sbase, RANGE), "--workers", "2")
    T.check(rc == 0 and out["samples"] == NSHARDS * 12, "re-indexed: %s" % out.get("error"))

    # --- a shard rewritten to the same size (one byte of a member's data changed) after
    # indexing: range reads cannot tell; the cache checks the download's CRC-32 and refuses it,
    # naming the URL, keeping no copy; a version 1 index (no checksum) still loads ------------
    same = os.path.join(work, "same")
    shutil.copytree(root, same)
    spath = os.path.join(same, "shard-000001.tar")
    with tarfile.open(spath) as tf:
        m = next(m for m in tf.getmembers() if m.name.endswith(".bin"))
    with open(spath, "r+b") as f:
        f.seek(m.offset_data)
        b = f.read(1)
        f.seek(m.offset_data)
        f.write(bytes([b[0] ^ 0xFF]))
    senv = {"STOKE_CACHE_DIR": os.path.join(work, "scache")}
    rc, out, err = load("tar:%s%s,fields=bin:cls" % (ng.url("same/"), RANGE), "--workers", "0",
                        env=senv)
    left = os.listdir(senv["STOKE_CACHE_DIR"])
    if ZLIB:
        T.check(rc == 1 and ng.url("same/shard-000001.tar") in out["error"]
                and "CRC-32" in out["error"] and "stoke index" in out["error"]
                and not any("shard-000001" in n or n.endswith(".part") for n in left),
                "a same-size rewrite, cache: %s; cache %s" % (out.get("error"), left))
    else:
        T.check(rc == 0, "without zlib, nothing is checked: %s" % out.get("error"))
    idx1 = os.path.join(same, "shard-000001.tar.idx")
    lines = open(idx1, "rb").read().split(b"\n")
    if lines[0] == b"stoke-tar-index 2":
        with open(idx1, "wb") as f:  # the same index as version 1: no checksum
            f.write(b"\n".join([b"stoke-tar-index 1", lines[1]] + lines[3:]))
    shutil.rmtree(senv["STOKE_CACHE_DIR"])
    rc, out, err = load("tar:%s%s,fields=bin:cls" % (ng.url("same/"), RANGE), "--workers", "0",
                        env=senv)
    T.check(rc == 0 and out["samples"] == NSHARDS * 12, "version 1 index: %s" % out.get("error"))

    # --- an index whose shard-bytes is absurd, with the cache: the download of that shard
    # fails, and nothing is evicted to make room for it (the other copies stay) -------------
    huge = os.path.join(work, "huge")
    shutil.copytree(root, huge)
    ipath = os.path.join(huge, "shard-000001.tar.idx")
    body = open(ipath, "rb").read()
    size1 = os.path.getsize(os.path.join(huge, "shard-000001.tar"))
    T.check(b"shard-bytes %d\n" % size1 in body, "index head: %r" % body[:80])
    with open(ipath, "wb") as f:
        f.write(body.replace(b"shard-bytes %d\n" % size1, b"shard-bytes 999999999999999\n"))
    henv = {"STOKE_CACHE_DIR": os.path.join(work, "hcache")}
    rc, out, err = load("tar:%s%s,fields=bin:cls" % (base, RANGE), "--workers", "0", env=henv)
    kept = sorted(n for n in os.listdir(henv["STOKE_CACHE_DIR"]) if len(n) > 33 and n[32] == "-")
    T.check(rc == 0 and len(kept) == NSHARDS, "the cache filled: %s %s" % (kept, out.get("error")))
    rc, out, err = load("tar:%s%s,fields=bin:cls" % (ng.url("huge/"), RANGE), "--workers", "0",
                        env=henv)
    T.check(rc == 1 and "shard-000001.tar" in out["error"], "absurd size: %s" % out.get("error"))
    now = sorted(n for n in os.listdir(henv["STOKE_CACHE_DIR"]) if len(n) > 33 and n[32] == "-")
    T.check(set(kept) <= set(now), "copies evicted for a shard of 10^15 bytes: %s -> %s"
            % (kept, now))

    # --- malformed indexes: the open fails naming the index ---------------------------------
    mal = os.path.join(work, "mal")
    shutil.copytree(root, mal)
    mbase = ng.url("mal/")
    good = open(os.path.join(root, "shard-000002.tar.idx"), "rb").read()
    glines = good.split(b"\n")
    first = glines.index(b"members 36") + 1  # the first member's line (0-based)
    cases = [(b"garbage\n", "line 1"),
             (glines[0][:-1] + b"7" + good[len(glines[0]):], "version 1 or 2"),
             (good[:-4], "expected 'end'"),  # cut short
             (good + b"more\n", "expected 'end'"),
             (good.replace(b"members 36", b"members 37"), "line %d" % (first + 37)),
             (b"\n".join(glines[:first] + [b"1 0 5 3 a.b"] + glines[first + 1:]),
              "does not fit")]
    if glines[0] == b"stoke-tar-index 2":
        cases += [(good.replace(glines[2], b"shard-crc32 12345"), "expected 'shard-crc32 HEX'"),
                  (good.replace(glines[2], glines[2].upper()), "expected 'shard-crc32 HEX'"),
                  (good.replace(glines[2] + b"\n", b""), "expected 'shard-crc32 HEX'")]
    for body, want in cases:
        with open(os.path.join(mal, "shard-000002.tar.idx"), "wb") as f:
            f.write(body)
        rc, out, err = load("tar:%s%s" % (mbase, RANGE), "--workers", "0")
        T.check(rc == 1 and mbase + "shard-000002.tar.idx" in out["error"]
                and want in out["error"], "malformed (%s): %s" % (want, out.get("error")))
    print("ok: indexes written, used (%d shards), 404s walked, stale and malformed refused"
          % NSHARDS)
finally:
    ng.stop()
