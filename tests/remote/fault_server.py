"""A small HTTP/1.1 file server on 127.0.0.1 with faults, for the remote-shard tests.

    python3 fault_server.py ROOT PORT_FILE

serves ROOT with Range requests and keep-alive; writes its port to PORT_FILE.  A request for
/MODE/ARG/PATH serves ROOT/PATH with a fault:
    ok/0        none
    503/N       the first N requests for PATH answer 503 (Retry-After: 0)
    cut/N       the first N requests for PATH send half of the body (the full Content-Length
                announced), then close the connection
    reset/N     the first N requests for PATH close the connection without an answer
    stall/N     the first N requests for PATH send half of the body, then nothing for 60 s (a
                download caught half way)
    failat/OFF  every request whose range starts at byte OFF answers 500 (a sample that cannot
                be read however often it is tried)
    shrink/N    after the first N requests for PATH, PATH is served as if it had half its size
                (a file replaced by a shorter one while it is read)
    norange/0   Range ignored: every answer a 200 with the whole file
    moved/0     a 307 to /ok/0/PATH on this server (a redirect)
GET /__stats answers {"/MODE/ARG/PATH": requests, ...} as JSON."""
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.abspath(sys.argv[1])
counts = {}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def log_message(self, fmt, *args):
        sys.stdout.write("%s %s\n" % (self.headers.get("Range"), fmt % args))
        sys.stdout.flush()

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/__stats":
            with lock:
                body = json.dumps(counts).encode()
            return self.answer(200, body)
        m = re.match(r"^/([a-z0-9]+)/(\d+)/(.+)$", self.path)
        if not m:
            return self.answer(400, b"bad path")
        mode, arg, rel = m.group(1), int(m.group(2)), m.group(3)
        with lock:
            n = counts[self.path] = counts.get(self.path, 0) + 1
        path = os.path.join(ROOT, rel)
        if mode == "moved":
            return self.answer(307, b"", [("Location", "/ok/0/" + rel)])
        if not os.path.isfile(path):
            return self.answer(404, b"<html>404 Not Found</html>")
        size = os.path.getsize(path)
        if mode == "shrink" and n > arg:
            size //= 2
        start, end, status = 0, size - 1, 200
        r = re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if mode == "norange":
            r = None
        if r:
            start = int(r.group(1))
            end = min(int(r.group(2)) if r.group(2) else size - 1, size - 1)
            if start >= size:
                return self.answer(416, b"", [("Content-Range", "bytes */%d" % size)])
            status = 206
        if mode == "503" and n <= arg:
            return self.answer(503, b"try again", [("Retry-After", "0")])
        if mode == "failat" and start == arg:
            return self.answer(500, b"<Error><Code>InternalError</Code>"
                                    b"<Message>injected</Message></Error>")
        if mode == "reset" and n <= arg:
            self.close_connection = True
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode in ("cut", "stall") and n <= arg:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if mode == "stall":
                time.sleep(60)
            self.close_connection = True
            return
        self.wfile.write(body)


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
tmp = sys.argv[2] + ".tmp"
with open(tmp, "w") as f:
    f.write("%d\n" % srv.server_address[1])
os.rename(tmp, sys.argv[2])
srv.serve_forever()
