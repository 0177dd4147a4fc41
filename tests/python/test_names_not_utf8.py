"""A file whose name is not UTF-8 (Linux names are bytes) in what stoke reports about it: a bad
JPEG named b"bad\\xff.jpg" beside one named "café.jpg" (UTF-8).
  - Python, on_error="error": stoke.LoaderError (not a UnicodeDecodeError), its message with the
    byte as \\xff (backslashreplace);
  - Python, on_error="skip": quarantine() lists both, each "source" a str that os.fsencode
    turns back into the file's bytes (surrogateescape, as os.listdir gives names);
  - `stoke load --json`: one valid UTF-8 JSON object (the byte as \\udcff), whose quarantine
    sources give the bytes back the same way; "café" stays as it is.
Needs a build with libjpeg (skips, 77, without: the names would not reach a decoder)."""
import json
import os
import subprocess

import stoke_testlib as T

import stoke  # noqa: E402

if "libjpeg" not in (os.environ.get("STOKE_BUILD_FEATURES") or "libjpeg").split(","):
    T.skip("built without libjpeg")

work = T.tmpdir()
cls = os.path.join(work, "tree", "a").encode()
os.makedirs(cls)
BAD, CAFE = cls + b"/bad\xff.jpg", cls + "/café.jpg".encode()
for p in (BAD, CAFE):
    with open(p, "wb") as f:
        f.write(b"not a jpeg at all")
spec = "images:%s,size=16" % os.path.join(work, "tree")

# 1. the error: a LoaderError naming the file, its byte escaped
try:
    for _ in stoke.DataLoader(spec, batch_size=1, num_workers=0, pin_memory=False):
        pass
    T.check(False, "a bad JPEG raised nothing")
except stoke.LoaderError as e:
    T.check("bad\\xff.jpg" in str(e) and "bad\\xff.jpg" in e.message,
            "message: %r / %r" % (str(e), e.message))

# 2. the quarantine: sources give the names' bytes back
dl = stoke.DataLoader(spec, batch_size=1, num_workers=0, pin_memory=False, on_error="skip")
for _ in dl:
    pass
q = dl.quarantine()
T.check(sorted(os.fsencode(e["source"]) for e in q) == sorted([BAD, CAFE]),
        "quarantine sources: %r" % [e["source"] for e in q])
T.check(all("not a JPEG" in e["reason"] for e in q), "reasons: %r" % q)

# 3. the CLI's --json: valid UTF-8, the same sources
cli = os.environ.get("STOKE_CLI")
if not cli or not os.path.exists(cli):
    T.skip("the stoke CLI was not built (STOKE_CLI); the Python checks passed")
p = subprocess.run([cli, "load", spec, "--on-error=skip", "--workers", "0", "--json"],
                   capture_output=True, timeout=60)
T.check(p.returncode == 0, "stoke load: rc %d: %r" % (p.returncode, p.stderr[-500:]))
try:
    out = json.loads(p.stdout.decode("utf-8"))  # strict: a raw 0xff fails here
except (UnicodeDecodeError, ValueError) as e:
    T.check(False, "stoke load --json is not UTF-8 JSON (%s): %r" % (e, p.stdout[-800:]))
T.check(b"\\udcff" in p.stdout and "café".encode() in p.stdout, "bytes: %r" % p.stdout[-800:])
srcs = sorted(os.fsencode(e["source"]) for e in out["quarantine"])
T.check(srcs == sorted([BAD, CAFE]), "CLI quarantine sources: %r" % srcs)
print("ok")
