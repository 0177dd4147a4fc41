"""Remote data from a server that lies or attacks (docs/sources.md, "Remote data"), a small
server in this test on 127.0.0.1 (nginx will not misbehave so):
  - a Content-Range of an unknown size ("bytes A-B/*"): read as the local shard;
  - a 206 without a Content-Range (and one whose Content-Length is not its range's), after an
    honest first answer: STOKE_EIO naming it, for npy: and tar: range reads and the cache, and
    no copy left in the cache (the body was taken as the bytes asked for: other samples,
    "ok", and a wrong copy kept for later runs);
  - a 200 that never ends into the cache: stopped at the size the shard's sidecar index says;
    one whose Content-Length is larger than the disk could hold: refused before a byte is
    written; without an index, a chunked body that never ends on a 64 MiB file system: stopped
    with a hundredth of it free, no .part left (it grew until the disk was full), and a good
    shard loads with less than a tenth free (a cache at its default cap; run where a tmpfs can
    be mounted: as root, or in a user namespace);
  - a range request after an honest first chunk answered with a 200 carrying another version
    of the file (10 KiB longer, no validators), into the cache (map mode and mode=stream):
    STOKE_EIO "changed while it was read" naming the URL, no copy kept (the chunks' offsets
    were read from the other version: a copy of two versions kept, "ok", a wrong hash);
  - a download's first chunk cut half way and its retry answered with a 200 (the whole
    file) while the other chunks are out, into the cache (map mode and mode=stream): the
    local shard's samples, the copy kept (the whole file was written again over them:
    "the file is N bytes, 2N came", nothing kept);
  - a 416 whose Content-Range says the file goes on past the range's start (once for each
    range from byte 131072 on): retried, the local shard's samples in map mode, mode=stream
    and the cache; without retries, STOKE_EIO naming the URL and the 416 (it was the file's
    end: "truncated: a header ... cut short by the end of the file", "the file is N bytes,
    131072 came");
  - a shard of 1.8 MB sent gzip'd (Content-Encoding: gzip), in map mode and mode=stream:
    STOKE_EIO naming the URL and the encoding (mode=stream parsed its first bytes as a tar:
    "bad header checksum field");
  - a Content-Range of 2^64 - 1 bytes to the cache's read-ahead of the second of 6 shards, while
    the first is coming: refused, and the read-ahead goes on (the fourth shard asked for while
    the read downloads the second; the refused size was taken as the largest file's, and no
    read-ahead had room after it);
  - a server that trickles (a byte every 0.5 s) with STOKE_REMOTE_TIMEOUT=2: STOKE_EIO naming
    the URL within seconds, after its retries (only a stall of 2 s timed out: it never ended);
  - a sidecar index that never ends: refused at 64 MiB ("not an index"), the process's peak
    memory well under the 1 GiB it reached;
  - an error body echoing the request's headers: its Authorization is "***" in the message;
  - a password holding a raw '/', '?' or '#' (curl fails on the URL): in no message of
    `stoke load` and `stoke index` (text and --json; "pa/SECRET" was shown; the spellings,
    and what is kept, in tests/test_remote_redact.c);
  - `stoke index`: a password and a signature are in none of its errors (text and --json), and
    it never writes through a link another user planted at its temporary file's name (the
    name was SHARD.idx.tmp.PID).
Skips (77) without libcurl."""
import gzip
import http.server
import io
import json
import os
import re
import shutil
import socket
import socketserver
import subprocess
import sys
import tarfile
import threading
import time

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

CLI = R.need_cli_and_libcurl()
OPTS = ",fields=bin:cls"

work = T.tmpdir()
root = os.path.join(work, "root")
paths, _ = S.make_shards(root, nshards=1)
shard = os.path.basename(paths[0])
T.check(subprocess.run([CLI, "index", "tar:" + paths[0]], capture_output=True).returncode == 0,
        "stoke index of the local shard")
npy_path = os.path.join(root, "x.npy")
rows = bytes(range(256)) * 1024  # 2048 rows of 128 bytes
header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2048, 128), }"
header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
with open(npy_path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + rows)




def make_aligned(path, fill, extra):
    """A tar of 20 members whose headers are at 64 KiB boundaries (each of fill + i), and with
    extra, 10 KiB more of its end's zeros: a chunk of one version read as the other's parses."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(20):
            ti = tarfile.TarInfo("s%02d.bin" % i)
            ti.size = 65536 - 512
            ti.mtime = 1700000000
            t.addfile(ti, io.BytesIO(bytes([(fill + i) % 256]) * ti.size))
    if extra:
        with open(path, "ab") as f:
            f.write(bytes(10240))


many, _ = S.make_shards(os.path.join(root, "many"), nshards=6, per_shard=3, big=20000)
aligned = os.path.join(root, "aligned.tar")
make_aligned(aligned, 0, False)
make_aligned(aligned + ".other", 100, True)  # another version, 10 KiB longer
T.check(os.path.getsize(aligned + ".other") == os.path.getsize(aligned) + 10240, "the versions")


def load(spec, *args, env=None):
    try:
        return R.load(spec, "--workers", "0", *args, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s %s: no answer within 60 s" % (spec, args))


class Hostile(http.server.BaseHTTPRequestHandler):
    """root's files under /MODE/: "nocr" honest for a range from byte 0, else a 206 without
    Content-Range carrying the file from its start; "badlen" the same, with a Content-Range
    and a Content-Length of other bytes than it says; "endless" the file's .idx honestly and
    the file as a 200 that never ends (chunked); "bigcl" a 200 saying 2^60 bytes; "endlessidx"
    the .idx as a 200 that never ends; "echo" a 404 whose body is the request's headers;
    "star" ranges whose Content-Range says "bytes A-B/*" after the first, and 416 past the
    end; "mix200" a range from byte 0 honestly, any other answered with a 200 of FILE.other
    (another version, without validators); "cut200" a range from byte 0 cut half way (the
    connection shut), one from bytes 1 to 131071 answered with a 200 of the file; "r416-*" a
    range from byte 131072 on answered once (per mode and range) with a 416 saying the file's
    size; "gzip" the file gzip'd, a 200 with its Content-Encoding; "trickle" a 206 of a byte
    every 0.5 s; "bogus" a *-000001.tar's first answer saying 2^64 - 1 bytes, its others' and
    any *-000000.tar's body 4 KiB then the rest after 1 s."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def handle(self):
        try:
            super().handle()
        except ConnectionError:  # stoke hung up on a body it refused
            pass

    def endless(self, length=None):
        self.send_response(200)
        if length:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = b"\0" * 65536
        chunk = block if length else b"%x\r\n" % len(block) + block + b"\r\n"
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass
        self.close_connection = True

    def answer(self, code, body, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # stoke hung up: it refused the answer, or has its bytes
            self.close_connection = True

    def do_GET(self):
        mode, _, rest = self.path.lstrip("/").split("?")[0].partition("/")
        path = os.path.join(root, rest)
        if mode == "echo":
            # a debug page: the request's path (its query), its headers, a session cookie
            # (the message keeps a body's first 160 characters: these first)
            body = repr({"Authorization": self.headers.get("Authorization"),
                         "Set-Cookie": "sid=Sess10nSecret; Path=/; HttpOnly",
                         "path": self.path}).encode()
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode == "endlessidx" and rest.endswith(".idx"):
            return self.endless()
        if mode in ("endless", "bigcl") and not rest.endswith(".idx"):
            return self.endless(1 << 60 if mode == "bigcl" else None)
        if mode == "star" and os.path.isfile(path):  # sizes not said after the first answer
            data = open(path, "rb").read()
            a, b = map(lambda g: int(g) if g else None, re.match(
                r"bytes=(\d+)-(\d*)$", self.headers["Range"]).groups())
            b = len(data) - 1 if b is None else min(b, len(data) - 1)
            if a >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%s" % (a, b, len(data) if a == 0
                                                                 else "*"))
            self.send_header("Content-Length", str(b - a + 1))
            self.end_headers()
            self.wfile.write(data[a:b + 1])
            return
        if not os.path.isfile(path) or (mode != "endless" and rest.endswith(".idx")):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = open(path, "rb").read()
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        a = int(m.group(1)) if m else 0
        b = min(int(m.group(2)) if m and m.group(2) else len(data) - 1, len(data) - 1)
        if mode.startswith("r416") and a >= 131072:
            with lock:
                first = (mode, rest, a) not in answered
                answered.add((mode, rest, a))
            if first:
                return self.answer(416, b"", [("Content-Range", "bytes */%d" % len(data))])
        if rest.endswith(".tar"):
            with lock:
                asked.setdefault(mode + "/" + rest, time.monotonic())
        if mode == "bogus" and rest.endswith("-000001.tar"):
            with lock:
                first = (mode, rest) not in answered
                answered.add((mode, rest))
            if first:
                return self.answer(206, data[a:b + 1], [("Content-Range", "bytes %d-%d/%d"
                                                         % (a, b, (1 << 64) - 1))])
        if mode == "bogus" and rest.endswith(("-000000.tar", "-000001.tar")):  # slow
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
            self.send_header("Content-Length", str(b - a + 1))
            self.end_headers()
            self.wfile.write(data[a:a + 4096])
            self.wfile.flush()
            time.sleep(1)
            with lock:
                asked.setdefault(mode + "/" + rest + " done", time.monotonic())
            self.wfile.write(data[a + 4096:b + 1])
            return
        if mode == "trickle":
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
            self.send_header("Content-Length", str(b - a + 1))
            self.end_headers()
            try:
                for i in range(a, b + 1):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:  # stoke gave up on it
                self.close_connection = True
            return
        if mode == "gzip":
            return self.answer(200, gzip.compress(data), [("Content-Encoding", "gzip")])
        if mode == "mix200" and a > 0:
            return self.answer(200, open(path + ".other", "rb").read())
        if mode == "cut200" and 0 < a < 131072:
            return self.answer(200, data)
        if mode == "cut200" and a == 0:
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
            self.send_header("Content-Length", str(b - a + 1))
            self.end_headers()
            self.wfile.write(data[a:a + (b - a + 1) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(206)
        if a == 0 or mode not in ("nocr", "badlen"):
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
            body = data[a:b + 1]
        elif mode == "nocr":  # the file from its start, as long as the range asked
            body = data[:b - a + 1]
        else:  # says the range, sends other bytes
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
            body = data[a:b]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


answered = set()  # r416's ranges answered once, bogus's files
asked = {}  # "MODE/PATH": when first asked for (and "MODE/PATH done": a slow body's end)
lock = threading.Lock()
srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hostile)
srv.daemon_threads = True
threading.Thread(target=srv.serve_forever, daemon=True).start()
base = "http://127.0.0.1:%d/" % srv.server_address[1]
EIO = "STOKE_EIO"

try:
    rc, local, _ = load("tar:%s%s" % (paths[0], OPTS))
    T.check(rc == 0 and local["samples"] == 12, "the local shard: %s" % local)
    rc, local_npy, _ = load("npy:" + npy_path)
    T.check(rc == 0 and local_npy["samples"] == 2048, "the local .npy: %s" % local_npy)

    # --- a 206 that does not say which bytes it holds, or says other ones --------------------
    for mode, said in (("nocr", "HTTP 206 without a Content-Range"),
                       ("badlen", "do not agree")):
        for spec, env in (("npy:%s%s/x.npy" % (base, mode), {}),
                          ("tar:%s%s/%s%s" % (base, mode, shard, OPTS), {}),
                          ("tar:%s%s/%s%s" % (base, mode, shard, OPTS),  # chunks of 64 KiB
                           {"STOKE_CACHE_DIR": os.path.join(work, "c-" + mode),
                            "STOKE_STREAM_AHEAD": "1M"})):
            rc, out, err = load(spec, env=dict(env, STOKE_REMOTE_RETRIES="1"))
            T.check(rc == 1 and out.get("error_name") == EIO and said in out["error"]
                    and "/%s/" % mode in out["error"],
                    "%s %s: %s %s" % (spec, env, out.get("error"), err[-300:]))
        cdir = os.path.join(work, "c-" + mode)
        T.check(os.listdir(cdir) == ["stoke-cache.lock"],
                "%s: the cache keeps nothing of it: %s" % (mode, os.listdir(cdir)))
    print("a 206 without its Content-Range, or with another length: refused, nothing kept")

    # a Content-Range of an unknown size, "bytes A-B/*" (RFC 9110), after a first that said it:
    # read as the local shard (it was "HTTP 206 without a Content-Range")
    rc, out, err = load("tar:%sstar/%s%s" % (base, shard, OPTS))
    T.check(rc == 0 and out["content_hash"] == local["content_hash"],
            "bytes A-B/*: %s %s" % (out.get("error"), err[-300:]))
    print("a Content-Range of an unknown size: read")

    # --- another version of the file in a 200 to a chunk's range request ---------------------
    rc, local_al, _ = load("tar:%s,fields=bin" % aligned)
    T.check(rc == 0 and local_al["samples"] == 20, "the local aligned.tar: %s" % local_al)
    for extra in ("", ",mode=stream"):
        cdir = os.path.join(work, "c-mix200" + extra.replace(",mode=", "-"))
        rc, out, err = load("tar:%smix200/aligned.tar,fields=bin%s" % (base, extra),
                            env={"STOKE_CACHE_DIR": cdir, "STOKE_STREAM_AHEAD": "1M",
                                 "STOKE_REMOTE_CONNECTIONS": "4"})
        T.check(rc == 1 and out.get("error_name") == EIO
                and "the file changed while it was read" in out["error"]
                and "/mix200/aligned.tar" in out["error"],
                "a 200 of another version to a chunk%s: %s %s %s"
                % (extra, out.get("error"), out.get("content_hash"), err[-300:]))
        T.check(os.listdir(cdir) == ["stoke-cache.lock"],
                "mix200%s: the cache keeps nothing of it: %s" % (extra, os.listdir(cdir)))
    print("a 200 of another version to a chunk's range: refused, nothing kept")

    # a first chunk cut, its retry answered with the whole file while the other chunks are out
    for extra in ("", ",mode=stream"):
        cdir = os.path.join(work, "c-cut200" + extra.replace(",mode=", "-"))
        rc, out, err = load("tar:%scut200/%s%s%s" % (base, shard, OPTS, extra),
                            env={"STOKE_CACHE_DIR": cdir, "STOKE_STREAM_AHEAD": "1M",
                                 "STOKE_REMOTE_CONNECTIONS": "4"})
        T.check(rc == 0 and out["content_hash"] == local["content_hash"],
                "a first chunk's retry answered with a 200%s: %s %s"
                % (extra, out.get("error"), err[-300:]))
        kept = [n for n in os.listdir(cdir) if n.endswith("-" + shard)]
        T.check(len(kept) == 1 and os.path.getsize(os.path.join(cdir, kept[0]))
                == os.path.getsize(paths[0]), "cut200%s: the copy: %s" % (extra, os.listdir(cdir)))
    print("a first chunk's retry answered with the whole file: the shard, its copy kept")

    # a 416 in the middle of the file (its Content-Range says the size): retried, then an error
    chunked = {"STOKE_STREAM_AHEAD": "1M", "STOKE_REMOTE_CONNECTIONS": "4"}
    for k, (extra, env) in enumerate((("", {}), (",mode=stream", chunked),
                                      ("", dict(chunked, STOKE_CACHE_DIR=os.path.join(
                                          work, "c-r416"))))):
        rc, out, err = load("tar:%sr416-%d/%s%s%s" % (base, k, shard, OPTS, extra), env=env)
        T.check(rc == 0 and out["content_hash"] == local["content_hash"],
                "a 416 mid-file, retried%s %s: %s %s" % (extra, env, out.get("error"), err[-300:]))
    for k, (extra, env) in enumerate((("", {}), (",mode=stream", chunked),
                                      ("", dict(chunked, STOKE_CACHE_DIR=os.path.join(
                                          work, "c-r416-0"))))):
        rc, out, err = load("tar:%sr416-0%d/%s%s%s" % (base, k, shard, OPTS, extra),
                            env=dict(env, STOKE_REMOTE_RETRIES="0"))
        T.check(rc == 1 and out.get("error_name") == EIO and "HTTP 416 for a range from byte"
                in out["error"] and "/r416-0%d/%s" % (k, shard) in out["error"],
                "a 416 mid-file, not retried%s %s: %s %s"
                % (extra, env, out.get("error"), err[-300:]))
    print("a 416 mid-file: retried; an error naming it without retries")

    # a body with a Content-Encoding: refused as it starts, never parsed
    for extra in ("", ",mode=stream"):
        rc, out, err = load("tar:%sgzip/%s%s%s" % (base, shard, OPTS, extra))
        T.check(rc == 1 and out.get("error_name") == EIO
                and "Content-Encoding: gzip" in out["error"]
                and "/gzip/%s" % shard in out["error"],
                "a gzip'd body%s: %s %s" % (extra, out.get("error"), err[-300:]))
    print("a gzip'd body: an error naming the encoding")

    # a Content-Range of 2^64 - 1 bytes refused: the cache's read-ahead goes on
    cdir = os.path.join(work, "c-bogus")
    rc, out, err = load("tar:%sbogus/many/shard-{000000..000005}.tar%s" % (base, OPTS),
                        env={"STOKE_CACHE_DIR": cdir, "STOKE_REMOTE_CONNECTIONS": "2",
                             "STOKE_LOG": "debug"})
    T.check(rc == 0 and out["samples"] == 18 and "read-ahead of %sbogus/many/shard-000001.tar"
            % base in err and "longer than the" in err,
            "a bogus size to a read-ahead: %s %s" % (out.get("error"), err[-600:]))
    # the read's download of the second shard (1 s) asks for the fourth ahead of it
    ahead = asked.get("bogus/many/shard-000003.tar", 1e18)
    T.check(ahead < asked["bogus/many/shard-000001.tar done"],
            "the read-ahead stopped after a bogus size: the fourth shard asked for %.2f s after "
            "the second shard's download ended" % (ahead - asked["bogus/many/shard-000001.tar done"]))
    print("a bogus size to a read-ahead: refused, and the read-ahead goes on")

    # a server that trickles: a timeout as a stall is, retried, then an error
    t0 = time.monotonic()
    try:
        rc, out, err = R.load("npy:%strickle/x.npy" % base, "--workers", "0", timeout=30,
                              env={"STOKE_REMOTE_TIMEOUT": "2", "STOKE_REMOTE_RETRIES": "1"})
    except subprocess.TimeoutExpired:
        raise AssertionError("a trickling server: no answer within 30 s")
    took = time.monotonic() - t0
    T.check(rc == 1 and out.get("error_name") == EIO and "/trickle/x.npy" in out["error"]
            and "after 2 tries" in out["error"],
            "a trickling server: %s %s" % (out.get("error"), err[-300:]))
    print("a trickling server: timed out in %.1f s" % took)

    # --- bodies that do not end --------------------------------------------------------------
    c_end = os.path.join(work, "c-endless")
    rc, out, err = load("tar:%sendless/%s%s" % (base, shard, OPTS),
                        env={"STOKE_CACHE_DIR": c_end, "STOKE_REMOTE_RETRIES": "1"})
    size = os.path.getsize(paths[0])
    T.check(rc == 1 and out.get("error_name") == EIO
            and "longer than the %d bytes this download may take (the size its index says)"
            % size in out["error"], "an endless 200 with an index: %s %s"
            % (out.get("error"), err[-300:]))
    T.check(os.listdir(c_end) == ["stoke-cache.lock"], "endless: %s left" % os.listdir(c_end))
    c_big = os.path.join(work, "c-bigcl")
    rc, out, err = load("tar:%sbigcl/%s%s" % (base, shard, OPTS),
                        env={"STOKE_CACHE_DIR": c_big, "STOKE_REMOTE_RETRIES": "1"})
    T.check(rc == 1 and "this download may take (the free space of its file system"
            in out.get("error", ""), "a 200 of 2^60 bytes: %s %s" % (out.get("error"), err[-300:]))
    T.check(os.listdir(c_big) == ["stoke-cache.lock"], "bigcl: %s left" % os.listdir(c_big))
    print("an endless 200: stopped at the index's size; 2^60 bytes said: refused at once")

    # without an index, on a small file system: bounded by its free space less a hundredth
    small = os.path.join(work, "small")
    os.makedirs(small)
    # and a good shard where less than a tenth is free (a cache at its default cap: the
    # bound was the free space less a tenth, which refused every download there)
    script = ("mount -t tmpfs -o size=64m tmpfs '%s' || exit 99; mkdir -m 700 '%s/c' '%s/c2'; "
              "STOKE_CACHE_DIR='%s/c' STOKE_REMOTE_RETRIES=1 '%s' load "
              "'tar:%sendless/none-%s%s' --workers 0 --json; echo \"rc=$?\"; ls -A '%s/c'; "
              "head -c 56M /dev/zero > '%s/other'; STOKE_CACHE_DIR='%s/c2' '%s' load "
              "'tar:%splain/%s%s' --workers 0 --json --no-pin-memory >/dev/null 2>&1; "
              "echo \"good=$?\""
              % (small, small, small, small, CLI, base, shard, OPTS, small, small, small, CLI,
                 base, shard, OPTS))
    cmd = (["sh", "-c", script] if os.geteuid() == 0 else
           ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script])
    if os.geteuid() == 0:  # the mount would be this process's: a namespace of its own
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if "rc=" not in p.stdout:
        print("not run: no tmpfs could be mounted here (%s)" % p.stderr.strip()[-200:])
    else:
        T.check("rc=1" in p.stdout and "the free space of its file system, less a hundredth"
                in p.stdout and "stoke-cache.lock\ngood=" in p.stdout,
                "an endless chunked 200 without an index on 64 MiB: %s %s"
                % (p.stdout[-600:], p.stderr[-300:]))
        T.check("good=0" in p.stdout, "a shard with 8 MiB of 64 free: %s" % p.stdout[-300:])
        print("an endless chunked 200 without an index: stopped at the disk's floor; a shard "
              "where less than a tenth is free: loaded")

    # an index that never ends: refused at 64 MiB, without holding a gigabyte: the peak of
    # its run (from its wait4: RUSAGE_CHILDREN's is the largest child's so far) over that of a
    # run refused at once (a 404) in the same environment (under AddressSanitizer, whose
    # shadow and allocator take more, one such run alone was over 256 MiB)
    def peak_of(spec):
        with open(os.path.join(work, "run.out"), "w+") as fo, \
                open(os.path.join(work, "run.err"), "w+") as fe:
            child = subprocess.Popen([CLI, "load", spec, "--json", "--batch-size", "5",
                                      "--no-pin-memory", "--workers", "0"], stdout=fo, stderr=fe,
                                     text=True, env={k: v for k, v in os.environ.items()
                                                     if k not in R.CACHE_ENV})
            timer = threading.Timer(60, child.kill)  # (no answer within 60 s: killed, fails)
            timer.start()
            _, status, usage = os.wait4(child.pid, 0)
            timer.cancel()
            child.returncode = os.waitstatus_to_exitcode(status)
            fo.seek(0)
            fe.seek(0)
            return child.returncode, json.loads(fo.read()), fe.read(), usage.ru_maxrss

    rc, out, err, peak = peak_of("tar:%sendlessidx/%s%s" % (base, shard, OPTS))
    T.check(rc == 1 and "not an index" in out.get("error", ""),
            "an endless index: %s %s" % (out.get("error"), err[-300:]))
    rc, out, err, floor = peak_of("tar:%sok/missing.tar%s" % (base, OPTS))
    T.check(rc == 1 and "HTTP 404" in out.get("error", ""), "a 404: %s" % out.get("error"))
    T.check(peak - floor < 256 << 10, "an endless index: peak RSS %d KiB, %d KiB over a 404's "
            "(it reached 1 GiB)" % (peak, peak - floor))
    print("an endless index: refused, peak RSS %d MiB (%d MiB over a 404's)"
          % (peak >> 10, (peak - floor) >> 10))

    # --- credentials echoed by an error body ---------------------------------------------------
    url = base.replace("http://", "http://alice:S3cr3tPw@") + "echo/" + shard
    # (an Azure SAS's sig, an API key by two spellings; the body's own text must stay)
    url += "?sv=2022-11-02&sig=S1gSecret%2Fab&x-api-key=K3ySecret&api_key=K3ySecret2"
    rc, out, err = load("tar:" + url + OPTS, env={"STOKE_LOG": "debug"})
    b64 = "YWxpY2U6UzNjcjN0UHc="  # alice:S3cr3tPw
    T.check(rc == 1 and "HTTP 404" in out.get("error", "") and "'Authorization': '***'"
            in out["error"] and "'Set-Cookie': '***'" in out["error"] and "/echo/" in out["error"],
            "an echoing 404: %s"
            % out.get("error"))
    for text in (json.dumps(out), err):
        for secret in (b64, "S3cr3tPw", "S1gSecret", "K3ySecret", "Sess10nSecret"):
            T.check(secret not in text, "a credential shown (%s): %s" % (secret, text))
    print("an error body's Authorization, query secrets and cookie: masked")

    # --- stoke index --------------------------------------------------------------------------
    secret = base.replace("http://", "http://alice:S3cr3tPw@")
    for args in (["tar:%sok/%s,fields=txt" % (secret, shard)],
                 ["tar:%sok/a.tar" % base, "tar:%sok/b.tar?X-Amz-Signature=deadbeef" % secret],
                 ["tar:%sok/" % secret, "--out", work]):
        for js in ([], ["--json"]):
            p = subprocess.run([CLI, "index"] + args + js, capture_output=True, text=True)
            T.check(p.returncode != 0 and "S3cr3tPw" not in p.stdout + p.stderr
                    and "deadbeef" not in p.stdout + p.stderr,
                    "stoke index %s: %s %s" % (args + js, p.stdout, p.stderr))
    # a password holding a raw '/', '?' or '#': in no message (only the last '@' ends it)
    for pw in ("pa/SECRET", "pa?SECRET", "pa#SECRET", "pa/x@y?SECRET"):
        url = "http://user:%s@127.0.0.1:1/x.tar" % pw
        for cmd in ([CLI, "load", "tar:%s,fields=bin" % url, "--workers", "0"],
                    [CLI, "index", "tar:" + url]):
            for js in ([], ["--json"]):
                p = subprocess.run(cmd + js, capture_output=True, text=True, timeout=60,
                                   env=dict(os.environ, STOKE_REMOTE_RETRIES="0"))
                T.check(p.returncode != 0 and "SECRET" not in p.stdout + p.stderr
                        and "x.tar" in p.stdout + p.stderr,
                        "a password %r: %s %s" % (pw, p.stdout, p.stderr))
    # a link at every name the temporary file had (SHARD.idx.tmp.PID, the next pids): the
    # index is written into a new file, never through one
    victim = os.path.join(work, "victim.txt")
    with open(victim, "w") as f:
        f.write("mine\n")
    idx_dir = os.path.join(work, "idx")
    os.makedirs(idx_dir)
    shutil.copy(paths[0], idx_dir)
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last = int(f.read())
    for pid in range(last + 1, last + 400):
        os.symlink(victim, os.path.join(idx_dir, "%s.idx.tmp.%d" % (shard, pid)))
    p = subprocess.run([CLI, "index", "tar:" + os.path.join(idx_dir, shard)],
                       capture_output=True, text=True)
    T.check(p.returncode == 0, "stoke index: %s %s" % (p.stdout, p.stderr))
    T.check(open(victim).read() == "mine\n", "the index was written through a planted link")
    made = os.path.join(idx_dir, shard + ".idx")
    T.check(not os.path.islink(made) and open(made).read() == open(paths[0] + ".idx").read(),
            "the index: a file of its own, equal to the first")
    T.check(len(os.listdir(idx_dir)) == 2 + 399, "files left: %d" % len(os.listdir(idx_dir)))
    print("stoke index: no credential in its errors, no write through a planted link")
finally:
    srv.shutdown()
    srv.server_close()
print("ok")
