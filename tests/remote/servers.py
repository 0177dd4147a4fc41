"""Real servers on 127.0.0.1 for the remote-shard tests (tests/python/test_remote*.py): nginx
(Debian nginx-light) serving a directory, s3rver (npm, installed under tests/remote/node_modules
by scripts/deps.sh) holding a bucket, and fault_server.py in front of a directory.  Each start_*
returns a Server (port, stop(), log()) or raises Unavailable with the reason (the test skips)."""
import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import time
import io

HERE = os.path.dirname(os.path.abspath(__file__))


class Unavailable(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    raise Unavailable("%s did not listen on port %d within %.0f s" % (what, port, timeout))


class Server:
    def __init__(self, proc, port, logs, scheme="http"):
        self.proc, self.port, self.logs, self.scheme = proc, port, logs, scheme

    def url(self, path=""):
        return "%s://127.0.0.1:%d/%s" % (self.scheme, self.port, path.lstrip("/"))

    def log(self):
        out = ""
        for p in self.logs:
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    out += f.read()
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format stoke '$connection $connection_requests $status "$http_range" $request_uri';
    access_log {prefix}/access.log stoke;
    log_format timing '$msec $request_time $connection $status $request_uri';
    access_log {prefix}/timing.log timing;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    keepalive_requests 100000;{extra}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port}{tls};
        root {root};{locations}
        location = /.stoke-settle {{ return 204; }}
    }}
}}
"""

TLS = """ ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key}"""


def make_cert(workdir):
    """A self-signed certificate for 127.0.0.1 (openssl): (cert.pem, key.pem)."""
    exe = shutil.which("openssl")
    if not exe:
        raise Unavailable("openssl is not installed")
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run([exe, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


def start_nginx(root, prefix, tls=None, extra="", locations=""):
    """nginx as the current user, in the foreground, serving root on a free port; https with
    tls=(cert, key); extra: more directives of the http block ("limit_rate 2m;"); locations:
    more of the server block ("location = /a.tar { return 403; }")."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                    else None)
    if not exe:
        raise Unavailable("nginx is not installed (Debian nginx-light: make deps)")
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    for attempt in range(5):
        port = free_port()
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(prefix=prefix, port=port, root=os.path.abspath(root),
                                      tls=TLS.format(cert=tls[0], key=tls[1]) if tls else "",
                                      extra=("\n    " + extra) if extra else "",
                                      locations=("\n        " + locations) if locations
                                      else ""))
        log = open(os.path.join(prefix, "stderr.log"), "w")
        proc = subprocess.Popen([exe, "-p", prefix, "-c", conf, "-e", prefix + "/error.log"],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                env=server_env())
        if wait_port(port, proc, "nginx"):
            return Server(proc, port, [os.path.join(prefix, "error.log")],
                          "https" if tls else "http")
        proc.wait()  # the port was taken in between: another one
    raise Unavailable("nginx did not start: %s" % open(os.path.join(prefix, "stderr.log")).read())


SETTLE = "/.stoke-settle"
_settled = [0]


def settle(prefix):
    """Wait until nginx (of prefix) has logged every request it has answered. nginx logs a
    request after its last byte is sent, so a client can have the whole answer, and exit, before
    the line is written: on a busy machine, a log read right after a run can miss the run's last
    request, or a mark taken before a run count the previous run's last one as this run's. nginx
    here is one process, one thread: once it has logged a request made after the client had its
    answers, it has logged those too. (A transfer the client cut off is logged when nginx finds
    the connection closed, which can be later: wait for those as the caller knows how.)"""
    with open(os.path.join(prefix, "nginx.conf")) as f:
        conf = f.read()
    port = int(re.search(r"listen 127\.0\.0\.1:(\d+)", conf).group(1))
    _settled[0] += 1
    uri = "%s?%d.%d" % (SETTLE, os.getpid(), _settled[0])
    try:
        if " ssl;" in conf:
            c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                            context=ssl._create_unverified_context())
        else:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", uri)
        c.getresponse().read()
        c.close()
    except OSError:
        return  # nginx has stopped: what it logged is all there is
    end = time.monotonic() + 10
    for name in ("access.log", "timing.log"):
        while not _has(os.path.join(prefix, name), uri):
            if time.monotonic() > end:
                raise AssertionError("nginx of %s did not log %s within 10 s" % (prefix, uri))
            time.sleep(0.01)


def _has(path, text):
    with open(path) as f:
        return text in f.read()


def access_log(prefix):
    """nginx's access log as (connection, request number on it, status, range, uri) tuples,
    once nginx has logged what it answered (settle)."""
    settle(prefix)
    rows = []
    with open(os.path.join(prefix, "access.log")) as f:
        for line in f:
            c, n, st, rest = line.split(" ", 3)
            rng, uri = rest.rsplit(" ", 1)
            if not uri.startswith(SETTLE):
                rows.append((int(c), int(n), int(st), rng.strip('"'), uri.strip()))
    return rows


def timings(prefix):
    """nginx's requests as (start, end, connection, status, uri) tuples, times in seconds
    (millisecond resolution): when each request was received and its answer was sent; once
    nginx has logged what it answered (settle)."""
    settle(prefix)
    rows = []
    with open(os.path.join(prefix, "timing.log")) as f:
        for line in f:
            end, took, c, st, uri = line.split()
            if not uri.startswith(SETTLE):
                rows.append((float(end) - float(took), float(end), int(c), int(st), uri))
    return rows


def most_at_once(rows, slack=0.003):
    """The most of rows' (start, end, ...) intervals that overlap at one instant, each shortened
    by `slack` seconds at its start (the log's times are rounded to the millisecond: one request
    after another on a connection can seem to overlap by one)."""
    ev = sorted([(min(r[0] + slack, r[1]), 1) for r in rows] + [(r[1], -1) for r in rows],
                key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def server_env():
    """The servers' environment: without the sanitizer runtime the test's python was started
    with (LD_PRELOAD of libtsan/libasan into nginx or node hangs or kills them)."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "TSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS"):
        env.pop(k, None)
    return env


def start_fault_server(root, workdir):
    """fault_server.py (tests/remote) serving root; its modes are in that file's docstring."""
    port_file = os.path.join(workdir, "fault.port")
    log = os.path.join(workdir, "fault.log")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fault_server.py"), root,
                             port_file], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=server_env())
    end = time.monotonic() + 20
    while not os.path.exists(port_file) or not open(port_file).read().endswith("\n"):
        if proc.poll() is not None or time.monotonic() > end:
            raise Unavailable("fault_server.py did not start: %s" % open(log).read())
        time.sleep(0.05)
    return Server(proc, int(open(port_file).read()), [log])


def start_s3rver(workdir, bucket):
    """s3rver (npm, tests/remote/node_modules) with an empty bucket, on a free port."""
    node = shutil.which("node") or shutil.which("nodejs")
    js = os.path.join(HERE, "node_modules", "s3rver", "bin", "s3rver.js")
    if not node:
        raise Unavailable("node is not installed (Debian nodejs)")
    if not os.path.exists(js):
        raise Unavailable("s3rver is not installed in %s (make deps, or: npm install "
                          "--prefix tests/remote)" % HERE)
    data = os.path.join(workdir, "s3data")
    os.makedirs(data, exist_ok=True)
    log = os.path.join(workdir, "s3rver.log")
    for attempt in range(5):
        port = free_port()
        proc = subprocess.Popen([node, js, "-d", data, "-a", "127.0.0.1", "-p", str(port),
                                 "--configure-bucket", bucket], stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=server_env())
        if wait_port(port, proc, "s3rver"):
            return Server(proc, port, [log])
        proc.wait()
    raise Unavailable("s3rver did not start: %s" % open(log).read())


def make_shards(root, nshards=4, per_shard=12, seed=7, big=None):
    """Tar shards root/shard-00000{0..}.tar of samples KEY.bin (2000 bytes), KEY.cls and KEY.txt
    (1..`big` bytes, 300 KB by default: a shard spans several of the source's 1 MiB windows).
    Returns the list of paths and, per shard, {member name: data offset} (for fault modes)."""
    import random
    rng = random.Random(seed)
    big = big or 300000
    paths, offsets = [], []
    os.makedirs(root, exist_ok=True)
    for s in range(nshards):
        p = os.path.join(root, "shard-%06d.tar" % s)
        with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(per_shard):
                key = "s%03d_%03d" % (s, i)
                members = [("bin", rng.randbytes(2000)), ("cls", b"%d\n" % rng.randrange(1000)),
                           ("txt", rng.randbytes(rng.randrange(1, big)))]
                for ext, data in members:
                    ti = tarfile.TarInfo("%s.%s" % (key, ext))
                    ti.size = len(data)
                    ti.mtime = 1700000000
                    t.addfile(ti, io.BytesIO(data))
        with tarfile.open(p) as t:
            offsets.append({m.name: m.offset_data for m in t.getmembers()})
        paths.append(p)
    return paths, offsets
