"""Remote tar shards at the edges (docs/sources.md, "Remote shards"), against nginx on 127.0.0.1
and, for what nginx cannot do, a small server in this test:
  - an empty (0-byte) shard through the cache (map mode, mode=stream, one connection) and
    `stoke index --out`: the error a local empty shard gives, naming the URL, after a few
    requests (each chunk of a 0-byte file was handed out again, forever: 200k requests in 20 s);
  - a shard without a sidecar index rewritten between the open and the epoch: STOKE_EIO "changed"
    naming the URL (the range reads took the new file's bytes at the old offsets, silently);
  - credentials: a password holding '@', and a presigned URL's X-Amz-Credential,
    X-Amz-Security-Token and X-Amz-Signature, are in no message and no log line;
  - a server that ignores ranges but says Content-Length (nginx `max_ranges 0`), a shard over
    the walk's 1 MiB window: read as the local shard (it was refused: "did not say the size");
  - a presigned URL (a query) whose index, asked for with the same query, is refused (S3's 403
    SignatureDoesNotMatch): the shard is walked, as on a 404 (the open failed);
  - a body with Content-Encoding: gzip (an object stored encoded): an error naming the encoding
    (its bytes were parsed as a tar: "bad header checksum");
  - a server that caps a range's bytes (a 206 of at most 100,000 bytes whose Content-Range says
    so): read as the local shard, with no retry (each answer counted as a fault before);
  - validators: a shard rewritten to the SAME size with other bytes (and another mtime: nginx's
    ETag is "mtime-size") between the open's walk and the epoch: STOKE_EIO "changed since the
    open" naming the URL, and under on_error=skip no sample of it delivered (the reads took the
    new file's bytes at the old offsets: other samples, exit 0); and a server whose ETag (or,
    without one, Last-Modified) changes with every answer: the open's walk, the cache's chunked
    download (no .part or copy left) and mode=stream's chunks of one pass fail, naming it, while
    a constant ETag, weak in every other answer, loads as the local shard;
  - the cache: a copy keeps its download's version (user.stoke.version): an open that walked
    the copies, then the copies evicted and downloaded again, unchanged (loads) and after a
    same-size rewrite (STOKE_EIO "changed since the open"; the new bytes were read at the old
    offsets), and another process's copies of a rewrite (STOKE_EIO "of another version"); a
    download that learns no version (STOKE_REMOTE_CHECK_VERSION=0) into a .part that had one
    leaves none (not run without user extended attributes in the test's directory).
Skips (77) without nginx or libcurl."""
import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import warnings

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

CLI = R.need_cli_and_libcurl()
EIO = -4  # include/stoke/status.h (never renumbered)
OPTS = ",fields=bin:cls"
CAP = 100000

work = T.tmpdir()
root = os.path.join(work, "root")
paths, _ = S.make_shards(root, nshards=1)  # shard-000000.tar: about 1.8 MB, over 1 MiB
T.check(os.path.getsize(paths[0]) > 1 << 20, "the shard must be over the walk's first window")
open(os.path.join(root, "empty.tar"), "wb").close()
os.makedirs(os.path.join(root, "v2"))
S.make_shards(os.path.join(root, "v2"), nshards=1, seed=99, per_shard=14)  # another, bigger
os.makedirs(os.path.join(root, "gz"))
shutil.copy(paths[0], os.path.join(root, "gz", "shard-000000.tar"))
os.makedirs(os.path.join(root, "chg"))
shutil.copy(paths[0], os.path.join(root, "chg", "shard-000000.tar"))
os.makedirs(os.path.join(root, "same"))
shutil.copy(paths[0], os.path.join(root, "same", "shard-000000.tar"))
os.makedirs(os.path.join(root, "kept"))
for i in range(2):
    shutil.copy(paths[0], os.path.join(root, "kept", "shard-%06d.tar" % i))


def load(spec, *args, env=None):
    """R.load bounded to 60 s (a hang is a failure here, not a stuck test)."""
    try:
        return R.load(spec, "--workers", "0", *args, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s %s %s: no answer within 60 s" % (spec, args, env))


rc, local, _ = load("tar:%s%s" % (paths[0], OPTS))
T.check(rc == 0 and local["samples"] == 12, "the local shard: %s" % local)


class Capped(http.server.BaseHTTPRequestHandler):
    """root's files with ranges, each 206 cut to CAP bytes (its Content-Range says so)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = os.path.join(root, self.path.lstrip("/").split("?")[0])
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = open(path, "rb").read()
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        a = int(m.group(1)) if m else 0
        b = min(int(m.group(2)) if m and m.group(2) else len(data) - 1, len(data) - 1,
                a + CAP - 1)
        self.send_response(206)
        self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        self.wfile.write(data[a:b + 1])


class Validators(http.server.BaseHTTPRequestHandler):
    """root's files under /MODE/ with ranges and, by MODE, an ETag "same" (weak in every other
    answer: RFC 9110's weak comparison holds them equal), an ETag that changes with every
    answer ("etag"), or no ETag and a Last-Modified that does ("lm"); ETags of 402 bytes, past
    what a message shows: the same one, weak in every other answer ("longsame"), or one whose
    end changes with every answer ("longtail")."""
    protocol_version = "HTTP/1.1"
    answers = [0]
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_GET(self):
        mode, _, rest = self.path.lstrip("/").split("?")[0].partition("/")
        path = os.path.join(root, rest)
        if mode not in ("same", "etag", "lm", "longsame", "longtail") or not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.lock:
            self.answers[0] += 1
            k = self.answers[0]
        data = open(path, "rb").read()
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        a = int(m.group(1)) if m else 0
        b = min(int(m.group(2)) if m and m.group(2) else len(data) - 1, len(data) - 1)
        self.send_response(206)
        if mode == "same":
            self.send_header("ETag", ('W/"same"', '"same"')[k % 2])
        elif mode == "etag":
            self.send_header("ETag", '"v%d"' % k)
        elif mode == "longsame":
            self.send_header("ETag", ('W/', '')[k % 2] + '"' + "a" * 400 + '"')
        elif mode == "longtail":
            self.send_header("ETag", '"' + "a" * 300 + "v%05d" % k + "a" * 95 + '"')
        else:
            self.send_header("Last-Modified", self.date_time_string(1700000000 + k))
        self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        self.wfile.write(data[a:b + 1])


def same_size_other_bytes(path):
    """path rewritten (renamed over) with every .bin member's data inverted: the same size and
    headers, other samples; its mtime 10 s later than before (nginx's ETag is "mtime-size")."""
    import tarfile
    data = bytearray(open(path, "rb").read())
    with tarfile.open(path) as t:
        for m in t.getmembers():
            if m.name.endswith(".bin"):
                for i in range(m.offset_data, m.offset_data + m.size):
                    data[i] ^= 0xFF
    when = os.stat(path).st_mtime + 10
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.utime(path + ".new", (when, when))
    os.replace(path + ".new", path)


servers = []
capped = None
valid = None
try:
    ngdir = os.path.join(work, "nginx")
    try:
        # (an index asked for with a query: S3's answer to a presigned URL's signature reused)
        ng = S.start_nginx(root, ngdir, locations="location = /fail.tar { return 500; }\n"
                           "        location ~ \\.idx$ { if ($args != \"\") { return 403 "
                           "'<Error><Code>SignatureDoesNotMatch</Code></Error>'; } }\n"
                           "        location /gz/ { add_header Content-Encoding gzip; }")
        servers.append(ng)
        ng0 = S.start_nginx(root, os.path.join(work, "nginx-noranges"), extra="max_ranges 0;")
        servers.append(ng0)
    except S.Unavailable as e:
        T.skip(str(e))

    # --- an empty shard through the cache: an error at once, a few requests, no download left --
    url = ng.url("empty.tar")
    for extra, more in (("", {}), (",mode=stream", {}), ("", {"STOKE_REMOTE_CONNECTIONS": "0"})):
        cache = os.path.join(work, "cache-empty")
        shutil.rmtree(cache, ignore_errors=True)
        mark = len(S.access_log(ngdir))
        env = dict(more, STOKE_CACHE_DIR=cache)
        rc, out, err = load("tar:%s%s%s" % (url, OPTS, extra), env=env)
        asks = [r for r in S.access_log(ngdir)[mark:] if r[4] == "/empty.tar"]
        T.check(rc == 1 and url in out["error"] and "truncated" in out["error"],
                "an empty shard, %s %s: %s %s" % (extra, more, out.get("error"), err[-300:]))
        T.check(1 <= len(asks) <= 3, "an empty shard, %s %s: %d requests" % (extra, more,
                                                                           len(asks)))
        left = [n for n in os.listdir(cache) if n.endswith((".part", ".lock"))
                and n != "stoke-cache.lock"]
        T.check(not left, "an empty shard: a download left in the cache: %s" % left)
    idx = os.path.join(work, "idx")
    os.makedirs(idx)
    mark = len(S.access_log(ngdir))
    try:
        p = subprocess.run([CLI, "index", "tar:" + url, "--out", idx], capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("stoke index of an empty remote shard: no answer within 60 s")
    asks = [r for r in S.access_log(ngdir)[mark:] if r[4] == "/empty.tar"]
    T.check(p.returncode == 1 and url in p.stderr and "truncated" in p.stderr and len(asks) <= 3,
            "stoke index of an empty shard: %d %s, %d requests" % (p.returncode, p.stderr,
                                                                   len(asks)))

    # --- credentials: a password with '@', a presigned URL's query -----------------------------
    auth = ng.url("missing.tar").replace("http://", "http://bob:p@ssS3CRETpw@")
    rc, out, err = load("tar:" + auth + OPTS)
    T.check(rc == 1 and "S3CRET" not in out["error"] + err and "missing.tar" in out["error"],
            "a password with '@': %s %s" % (out.get("error"), err))
    q = "?X-Amz-Credential=AKIAEXAMPLE%2F20250101&X-Amz-Security-Token=SESSIONTOKEN" \
        "&X-Amz-Date=20250101T000000Z&X-Amz-Signature=0123deadbeef"
    secrets = ("AKIAEXAMPLE", "SESSIONTOKEN", "0123deadbeef")
    env = {"STOKE_LOG": "debug", "STOKE_REMOTE_RETRIES": "1"}
    for name in ("missing.tar", "fail.tar", "shard-000000.tar"):  # 404, 500 (retried), loaded
        spec = "tar:" + ng.url(name) + q + OPTS
        rc, out, err = load(spec, env=env)
        text = json.dumps(out) + err
        T.check(rc == (0 if name == "shard-000000.tar" else 1)
                and not [s for s in secrets if s in text],
                "a presigned URL, %s: a secret printed: %s %s" % (name, out.get("error"), err))
        T.check(rc == 0 or ("X-Amz-Signature=***" in out["error"]
                            and "X-Amz-Date=20250101T000000Z" in out["error"]),
                "a presigned URL, %s: %s" % (name, out.get("error")))
    # its index, asked for with the shard's query, is refused (403): the shard is walked, in
    # every mode, with the local shard's samples
    for extra, more in (("", {}), (",mode=stream", {}),
                        ("", {"STOKE_CACHE_DIR": os.path.join(work, "cache-presigned")})):
        mark = len(S.access_log(ngdir))
        rc, out, err = load("tar:" + ng.url("shard-000000.tar") + q + OPTS + extra, env=more)
        refused = [r for r in S.access_log(ngdir)[mark:]
                   if r[4].startswith("/shard-000000.tar.idx")]
        T.check(rc == 0 and out["content_hash"] == local["content_hash"]
                and out["samples"] == 12, "a presigned URL %s %s: %s %s"
                % (extra, more, out.get("error"), err[-300:]))
        T.check(extra or more or (refused and all(r[2] == 403 for r in refused)),
                "a presigned URL %s %s: its index asked for: %s" % (extra, more, refused))

    # --- a body with a Content-Encoding (an object stored gzip'd): an error that says so --------
    for extra, more in (("", {}), (",mode=stream", {}),
                        ("", {"STOKE_CACHE_DIR": os.path.join(work, "cache-gz")})):
        rc, out, err = load("tar:" + ng.url("gz/shard-000000.tar") + OPTS + extra, env=more)
        T.check(rc == 1 and "Content-Encoding: gzip" in out["error"]
                and "gz/shard-000000.tar" in out["error"],
                "a gzip'd body %s %s: %s" % (extra, more, out.get("error")))

    # --- a server that ignores ranges and says Content-Length: a shard over 1 MiB -------------
    for extra, more in (("", {}), (",mode=stream", {})):
        rc, out, err = load("tar:%s%s%s" % (ng0.url("shard-000000.tar"), OPTS, extra), env=more)
        T.check(rc == 0 and out["content_hash"] == local["content_hash"]
                and out["samples"] == 12,
                "ranges ignored %s: %s %s" % (extra, out.get("error"), err[-300:]))

    # --- a server that caps a range's bytes: progress, not faults -----------------------------
    capped = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Capped)
    capped.daemon_threads = True
    threading.Thread(target=capped.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d/" % capped.server_address[1]
    for extra, more in (("", {}), (",mode=stream", {}),
                        ("", {"STOKE_CACHE_DIR": os.path.join(work, "cache-cap")}),
                        ("", {"STOKE_REMOTE_CONNECTIONS": "0",
                              "STOKE_CACHE_DIR": os.path.join(work, "cache-cap0")})):
        more = dict(more, STOKE_REMOTE_RETRIES="2")
        rc, out, err = load("tar:%sshard-000000.tar%s%s" % (base, OPTS, extra), env=more)
        T.check(rc == 0 and out["content_hash"] == local["content_hash"]
                and out["samples"] == 12 and out["remote"]["retries"] == 0,
                "ranges capped at %d bytes %s %s: %s %s" % (CAP, extra, more, out.get("error"),
                                                            out.get("remote")))

    # --- validators: an ETag (or Last-Modified) that changes from answer to answer ---------
    valid = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Validators)
    valid.daemon_threads = True
    valid.handle_error = lambda *a: None  # a transfer stoke ends: a connection reset
    threading.Thread(target=valid.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d/" % valid.server_address[1]
    small = {"STOKE_STREAM_AHEAD": "1M", "STOKE_REMOTE_RETRIES": "1"}  # chunks of 64 KiB
    for mode, extra, more in (("same", "", {}), ("same", ",mode=stream", {}),
                              ("same", "", {"STOKE_CACHE_DIR": os.path.join(work, "cache-same")}),
                              ("longsame", "", {}), ("longsame", ",mode=stream", {})):
        rc, out, err = load("tar:%s%s/shard-000000.tar%s%s" % (base, mode, OPTS, extra),
                            env=dict(small, **more))
        T.check(rc == 0 and out["content_hash"] == local["content_hash"]
                and out["samples"] == 12, "a constant ETag, weak in every other answer %s %s: "
                "%s %s" % (extra, more, out.get("error"), err[-300:]))
    for mode, extra, cache, words in (
            ("lm", "", None, "changed since the open: its Last-Modified is "),  # the walk's
            ("etag", "", "cache-etag", "changed since the open: its ETag is \"v"),  # download
            ("longtail", "", None, "changed since the open: its ETag is \"aaaa"),  # whole
            ("etag", ",mode=stream", None, "changed while it was read: its ETag is \"v"),
            ("etag", ",mode=stream", "cache-etag-stream", "changed while it was read: its ETag")):
        env = dict(small)
        if cache:
            env["STOKE_CACHE_DIR"] = os.path.join(work, cache)
        url = "%s%s/shard-000000.tar" % (base, mode)
        rc, out, err = load("tar:%s%s%s" % (url, OPTS, extra), env=env)
        T.check(rc == 1 and url in out["error"] and words in out["error"]
                and "after" not in out["error"],  # not retried
                "a %s that changes, %s %s: %s %s" % (mode, extra, cache, out.get("error"),
                                                     err[-300:]))
        left = [n for n in os.listdir(env["STOKE_CACHE_DIR"]) if n != "stoke-cache.lock"
                and not n.endswith(".lock")] if cache else []
        T.check(not left, "a download whose chunks disagree was kept: %s" % left)

    # --- a shard rewritten between the open and the epoch (no sidecar index, no cache): last,
    # as it needs src/sources/tar_fields.c's size check (index_stale) for walked shards too ----
    try:
        import stoke
    except ImportError as e:
        stoke = None
        print("a shard rewritten after the open: not run:", e)
    if stoke is not None:
        os.environ.pop("STOKE_CACHE_DIR", None)
        url = ng.url("chg/shard-000000.tar")
        dl = stoke.DataLoader("tar:" + url + OPTS, batch_size=4, num_workers=0,
                              structure="list", pin_memory=False)
        os.replace(os.path.join(root, "v2", "shard-000000.tar"),
                   os.path.join(root, "chg", "shard-000000.tar"))
        err = None
        try:
            for _ in dl:
                pass
        except stoke.LoaderError as e:
            err = e
        T.check(err is not None and err.code == EIO and "changed" in str(err) and url in str(err),
                "a shard rewritten after the open: %r" % ((err and (err.code, str(err))),))

        # --- ... rewritten to the SAME size, other bytes: its ETag (nginx's: mtime-size) says
        # it (the size check cannot); each batch and each sample read alone (on_error's get)
        url = ng.url("same/shard-000000.tar")
        shard = os.path.join(root, "same", "shard-000000.tar")
        for on_error in (None, "skip"):
            dl = stoke.DataLoader("tar:" + url + OPTS, batch_size=4, num_workers=0,
                                  structure="list", pin_memory=False, on_error=on_error)
            same_size_other_bytes(shard)
            err, got = None, 0
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # one per batch skipped
                    for b in dl:
                        got += len(b[0])
            except stoke.LoaderError as e:
                err = e
            if on_error is None:
                T.check(err is not None and err.code == EIO and url in str(err)
                        and "changed since the open: its ETag is" in str(err),
                        "a shard rewritten to the same size after the open: %r"
                        % ((err and (err.code, str(err))),))
            else:
                T.check(err is None and got == 0, "a shard rewritten to the same size, "
                        "on_error=skip: %d sample(s) delivered, %r" % (got, err))
        # mode=stream reads each shard front to back, each epoch: one rewritten after the open
        # is read as it is now (a pass's chunks are checked against each other, not the open's)
        dl = stoke.DataLoader("tar:" + url + OPTS + ",mode=stream", batch_size=4, num_workers=0,
                              structure="list", pin_memory=False)
        same_size_other_bytes(shard)
        got = sum(len(b[0]) for b in dl)
        T.check(got == 12, "mode=stream, a shard rewritten after the open: %d samples" % got)
        # STOKE_REMOTE_CHECK_VERSION=0 (servers whose replicas differ in ETag): not compared,
        # the rewritten shard's bytes are read (the size check stays); each loader keeps the
        # setting it was made with (it was one switch for the process: the last one made's)
        checked = stoke.DataLoader("tar:" + url + OPTS, batch_size=4, num_workers=0,
                                   structure="list", pin_memory=False)
        os.environ["STOKE_REMOTE_CHECK_VERSION"] = "0"
        try:
            dl = stoke.DataLoader("tar:" + url + OPTS, batch_size=4, num_workers=0,
                                  structure="list", pin_memory=False)
        finally:
            del os.environ["STOKE_REMOTE_CHECK_VERSION"]
        same_size_other_bytes(shard)
        got = sum(len(b[0]) for b in dl)
        T.check(got == 12, "STOKE_REMOTE_CHECK_VERSION=0: %d samples" % got)
        err = None
        try:
            for _ in checked:
                pass
        except stoke.LoaderError as e:
            err = e
        T.check(err is not None and "changed since the open" in str(err),
                "the loader made before STOKE_REMOTE_CHECK_VERSION=0 still checks: %r" % err)

        # --- the cache: a copy keeps the version its download had (user.stoke.version), so an
        # open that walks the copy and asks the server nothing knows it: a download after the
        # copy's eviction, or another process's copy of a rewrite, is compared with it.  Two
        # shards, 0 workers: the reads hold one copy open (slot 0 keeps the last one it read:
        # one of the open's), the other shard's copy is opened by name
        url = ng.url("kept/shard-{000000..000001}.tar")
        kept = [os.path.join(root, "kept", "shard-%06d.tar" % i) for i in range(2)]
        cache = os.path.join(work, "cache-kept")
        os.makedirs(cache)
        try:
            os.setxattr(cache, "user.stoke.probe", b"1")
        except OSError as e:
            cache = None
            print("a copy's version (the cache): not run: no user extended attributes "
                  "under %s: %s" % (work, e))
    if stoke is not None and cache is not None:
        os.environ["STOKE_CACHE_DIR"] = cache

        def copies():
            return sorted(os.path.join(cache, n) for n in os.listdir(cache)
                          if n.endswith(".tar"))

        def epoch(dl):
            err, keys = None, []
            try:
                for b in dl:
                    keys += [bytes(x[:8]) for x in b[0]]
            except stoke.LoaderError as e:
                err = e
            return err, sorted(keys)

        def kept_loader():
            return stoke.DataLoader("tar:" + url + OPTS, batch_size=4, num_workers=0,
                                    structure="list", pin_memory=False)

        def evict():
            for c in copies():
                os.remove(c)
        try:
            err, first = epoch(kept_loader())  # downloads the copies
            T.check(err is None and len(first) == 24, "the cache's first run: %r" % err)
            T.check(len(copies()) == 2 and all(os.getxattr(c, "user.stoke.version")[:1]
                                               in (b"E", b"L") for c in copies()),
                    "the copies keep no version: %s" % copies())
            # the same version downloaded again after an eviction: no false alarm
            dl = kept_loader()  # its open walks the copies: no request
            evict()
            err, again = epoch(dl)
            T.check(err is None and again == first and copies(),  # (the read-ahead's too)
                    "a copy downloaded again, unchanged: %r, %s" % (err, copies()))
            # rewritten to the same size, the copies evicted after the open: the download of
            # the one not held open is of another version
            dl = kept_loader()
            for k in kept:
                same_size_other_bytes(k)
            evict()
            err, _ = epoch(dl)
            T.check(err is not None and err.code == EIO and "kept/shard-00000" in str(err)
                    and "changed since the open: its ETag is" in str(err),
                    "a copy walked on disk, evicted, the shard rewritten: %r"
                    % ((err and (err.code, str(err))),))
            T.check(not copies(), "a download of another version was kept: %s" % copies())
            # another process replaced the copies with the rewrite's after this one's open
            dl = kept_loader()  # downloads the copies of the shards as they are now
            for k in kept:
                same_size_other_bytes(k)
            evict()
            rc, out, err = load("tar:" + url + OPTS, env=dict(os.environ))
            T.check(rc == 0 and len(copies()) == 2, "the other process's download: %s %s"
                    % (out.get("error"), err[-300:]))
            err, _ = epoch(dl)
            T.check(err is not None and err.code == EIO and "kept/shard-00000" in str(err)
                    and "is of another version than the open's" in str(err),
                    "another process's copy of a rewrite: %r" % ((err and (err.code, str(err))),))
            # a killed download's .part, truncated by the next download of the file, keeps its
            # attributes: a download that learns no version (STOKE_REMOTE_CHECK_VERSION=0)
            # removes the old one, else the copy would claim it
            # (a loader's own download: a new process's first scan removes .part files no one
            # holds; this one holds the file's lock while it truncates the .part)
            os.environ["STOKE_REMOTE_CHECK_VERSION"] = "0"
            try:
                dl = kept_loader()  # its open walks the copies
            finally:
                del os.environ["STOKE_REMOTE_CHECK_VERSION"]
            for c in copies():  # each copy a .part left with a version, the copy gone
                part = os.path.join(cache, os.path.basename(c)[:32] + ".part")
                shutil.copy(c, part)
                os.setxattr(part, "user.stoke.version", os.getxattr(c, "user.stoke.version"))
                os.remove(c)
            err, again = epoch(dl)

            def version(c):
                try:
                    return os.getxattr(c, "user.stoke.version")
                except OSError:
                    return None
            T.check(err is None and len(again) == 24 and copies()
                    and not any(map(version, copies())),
                    "downloads without a version: %r %s" % (err, [version(c) for c in copies()]))
        finally:
            del os.environ["STOKE_CACHE_DIR"]
    if stoke is not None:
        del dl, checked
finally:
    if capped is not None:
        capped.shutdown()
        capped.server_close()
    if valid is not None:
        valid.shutdown()
        valid.server_close()
    for s in servers:
        s.stop()
print("ok")
