"""`stoke load` of a URL with user:password@ never prints the password (docs/sources.md,
"Remote data": credentials are never printed or logged): not in the --json object's "source",
not in the text summary, not in the usage error for two sources.  The run itself succeeds
against nginx on 127.0.0.1 (which ignores the credentials), with the samples of the shards read
from disk.  Skips (77) without nginx or libcurl."""
import json
import os
import subprocess
import sys

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402

os.environ.pop("STOKE_CACHE_DIR", None)
s = R.setup(2)
try:
    url = s.ng.url(s.rng)
    T.check(url.startswith("http://127.0.0.1:"), url)
    secret = "S3CRETpw"
    spec = "tar:" + url.replace("http://", "http://bob:%s@" % secret, 1) + ",fields=bin:cls"
    shown = "tar:" + url + ",fields=bin:cls"
    local = "tar:%s,fields=bin:cls" % os.path.join(s.root, s.rng)
    base = [s.cli, "load", "--workers", "0", "--no-pin-memory"]

    p = subprocess.run(base + [spec, "--json"], capture_output=True, text=True, timeout=120)
    T.check(p.returncode == 0, "stoke load --json: %s" % p.stderr)
    out = json.loads(p.stdout)
    T.check(secret not in p.stdout + p.stderr, "the password printed: %r %r"
            % (p.stdout[:400], p.stderr[:400]))
    T.check(out["source"] == shown, "source %r, expected %r" % (out["source"], shown))
    q = subprocess.run(base + [local, "--json"], capture_output=True, text=True, timeout=120)
    ref = json.loads(q.stdout)
    T.check(out["samples"] > 0 and out["content_hash"] == ref["content_hash"],
            "remote %s vs local %s" % (R.summary(out), R.summary(ref)))

    p = subprocess.run(base + [spec], capture_output=True, text=True, timeout=120)
    T.check(p.returncode == 0, "stoke load: %s" % p.stderr)
    T.check(secret not in p.stdout + p.stderr, "the password printed: %r" % p.stdout[:400])
    T.check(("stoke load %s:" % shown) in p.stdout, "summary: %r" % p.stdout[:400])

    p = subprocess.run(base + [spec, spec, "--json"], capture_output=True, text=True, timeout=60)
    T.check(p.returncode == 2 and "only one SOURCE" in p.stderr, "two sources: %r" % p.stderr)
    T.check(secret not in p.stdout + p.stderr, "the password printed: %r" % p.stderr)
finally:
    s.ng.stop()
print("ok")
