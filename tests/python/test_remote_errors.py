"""Remote shards that fail mid-epoch, against nginx on 127.0.0.1 (no cache: a batch's samples
are requested together, several in flight; docs/sources.md, "Remote shards", "Faults").  The
shards have sidecar indexes, so the open succeeds and the failures come in the epoch:
  a/  shard 1 removed after indexing (404)     -> STOKE_ENOENT
  b/  shard 1 answered 403 (nginx `return`)    -> STOKE_EIO, read through user:password@
  c/  shard 1 answered 500 (retried, then)     -> STOKE_EIO, "(after 2 tries)"
  d/  shard 0 answered 500 and shard 1 removed, both in one batch: the error is the request
      that failed for good (404), its own URL and status, not the other one's
Under on_error=error the batches before the bad shard arrive (equal to the local ones) and then
stoke.LoaderError has the code, the sample and a message naming the URL and the HTTP status
(and nginx's reason); under on_error=skip the samples of the good shards all arrive, equal to
the local ones, and the quarantine lists every bad sample with its code and reason; `stoke load
--json` fails with the code ("error_code", "error_name").  Under a path of 304 characters the
messages (CLI, LoaderError, quarantine) still end with the URL's request and its HTTP status.
The password of a URL never appears.  Skips (77) without nginx or libcurl."""
import os
import subprocess
import sys

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

CLI = R.need_cli_and_libcurl()
import stoke  # noqa: E402

ENOENT, EIO = -3, -4  # include/stoke/status.h (never renumbered)
OPTS = ",fields=bin:cls"
PER = 12  # samples per shard (servers.make_shards)
os.environ.pop("STOKE_CACHE_DIR", None)
os.environ["STOKE_REMOTE_RETRIES"] = "1"

work = T.tmpdir()
root = os.path.join(work, "root")
for sub in "abcd":
    S.make_shards(os.path.join(root, sub), nshards=3)
    p = subprocess.run([CLI, "index", "tar:%s/%s/shard-{000000..000002}.tar" % (root, sub)],
                       capture_output=True, text=True, timeout=120)
    T.check(p.returncode == 0, "stoke index: %s" % p.stderr)
local = os.path.join(root, "a")  # every directory has the same shards (make_shards' seed)
# e/: the shards under a path of 304 characters (a long S3 key's URL), shard 1 gone (its index
# stays: it fails in the epoch) and shard 2 gone with no index (it fails at open)
LONG = "/".join(["k" * 60] * 5)
S.make_shards(os.path.join(root, "e", LONG), nshards=3)
p = subprocess.run([CLI, "index", "tar:%s/e/%s/shard-{000000..000001}.tar" % (root, LONG)],
                   capture_output=True, text=True, timeout=120)
T.check(p.returncode == 0, "stoke index: %s" % p.stderr)
for k in (1, 2):
    os.rename(os.path.join(root, "e", LONG, "shard-%06d.tar" % k),
              os.path.join(work, "gone-e%d.tar" % k))
os.rename(os.path.join(root, "a", "shard-000001.tar"), os.path.join(work, "gone-a.tar"))
os.rename(os.path.join(root, "d", "shard-000001.tar"), os.path.join(work, "gone-d.tar"))
LOCATIONS = ("location = /b/shard-000001.tar { return 403; } "
             "location = /c/shard-000001.tar { return 500; } "
             "location = /d/shard-000000.tar { return 500; }")


def rows(batches):
    return [bytes(x) for b in batches for x in b[0].numpy()]


want = {k: rows(stoke.DataLoader("tar:%s/shard-%06d.tar%s" % (local, k, OPTS), batch_size=4,
                                  structure="list")) for k in (0, 2)}
rc, out, _ = R.load("tar:%s/shard-000000.tar%s" % (local, OPTS))
T.check(rc == 0 and out["ok"] is True and out["error"] is None and out["error_code"] is None
        and out["error_name"] is None, "a run that passes: %s" % out)

try:
    ng = S.start_nginx(root, os.path.join(work, "nginx"), locations=LOCATIONS)
except S.Unavailable as e:
    T.skip(str(e))
try:
    base = ng.url("")
    auth = base.replace("http://", "http://reader:s3cr3t-pw@")
    cases = [  # (directory, URL base, code, status text, more text)
        ("a", base, ENOENT, "HTTP 404", "404 Not Found"),
        ("b", auth, EIO, "HTTP 403", "403 Forbidden"),
        ("c", base, EIO, "HTTP 500", "(after 2 tries)"),
    ]
    for sub, url, code, status, more in cases:
        spec = "tar:%s%s/shard-{000000..000002}.tar%s" % (url, sub, OPTS)
        bad_url = "%s%s/shard-000001.tar" % (base, sub)
        # --- on_error=error: the good batches, then the error of the bad shard's request
        got = []
        it = iter(stoke.DataLoader(spec, batch_size=4, structure="list", num_workers=0))
        err = None
        try:
            for b in it:
                got.append(b)
        except stoke.LoaderError as e:
            err = e
        T.check(err is not None, "%s: no error" % sub)
        msg = str(err)
        T.check(rows(got) == want[0], "%s: the batches before the bad shard differ" % sub)
        T.check(err.code == code and PER <= err.sample < 2 * PER,
                "%s: code %s (%s), sample %s, wanted %d in [%d, %d): %s"
                % (sub, err.code, err.code_name, err.sample, code, PER, 2 * PER, msg))
        T.check(("GET %s: %s" % (bad_url, status)) in msg and more in msg,
                "%s: the message does not name the URL, the status and the reason: %s"
                % (sub, msg))
        T.check("s3cr3t" not in msg and "reader:" not in msg, "%s: credentials in %s" % (sub, msg))
        # --- on_error=skip: every good sample, and each bad one in the quarantine
        loader = stoke.DataLoader(spec, batch_size=4, structure="list", num_workers=2,
                                  on_error="skip")
        got = rows(list(loader))
        T.check(got == want[0] + want[2],
                "%s, skip: %d samples, %d wanted (shards 0 and 2)" % (sub, len(got),
                                                                      2 * PER))
        q = loader.quarantine()
        T.check(sorted(e["index"] for e in q) == list(range(PER, 2 * PER)),
                "%s, skip: quarantined %s" % (sub, sorted(e["index"] for e in q)))
        for e in q:
            T.check(e["code"] == code and ("GET %s: %s" % (bad_url, status)) in e["reason"]
                    and more in e["reason"] and "s3cr3t" not in e["reason"] + e["source"],
                    "%s, skip: a quarantine entry: %s" % (sub, e))
        print("%s: %s; skip: %d samples, %d quarantined" % (sub, msg, len(got), len(q)))
        # --- the CLI: `stoke load --json` fails with the code's number and name in the summary
        rc, out, _ = R.load(spec, "--workers", "0")
        T.check(rc == 1 and out["ok"] is False and out["error_code"] == code
                and out["error_name"] == {ENOENT: "STOKE_ENOENT", EIO: "STOKE_EIO"}[code]
                and ("GET %s: %s" % (bad_url, status)) in out["error"],
                "%s: stoke load --json: exit %d, %s" % (sub, rc, {k: out.get(k) for k in (
                    "ok", "error", "error_code", "error_name")}))

    # --- one batch with requests failing two ways at once (shuffled: 404s and 500s in flight
    # together): the error is the one that fails for good (404, not retried), with its own URL
    # and status, though a 500 (to be retried) may end after it in the same round
    spec = "tar:%sd/shard-{000000..000002}.tar%s" % (base, OPTS)
    for attempt in range(8):
        it = iter(stoke.DataLoader(spec, batch_size=3 * PER, structure="list", num_workers=0,
                                   shuffle=True, seed=attempt))
        try:
            next(it)
            T.check(False, "d: the batch loaded")
        except stoke.LoaderError as e:
            msg = str(e)
            T.check(e.code == ENOENT and PER <= e.sample < 2 * PER
                    and ("GET %sd/shard-000001.tar: HTTP 404" % base) in msg
                    and "HTTP 500" not in msg,
                    "d: code %s, sample %s: %s" % (e.code_name, e.sample, msg))
        del it
    print("d: %s" % msg)

    # --- a long URL: every message keeps its end, the URL's whole request line and status
    long_base = "%se/%s/" % (base, LONG)
    for shards, bad, when in (("{000000..000001}", 1, "in the epoch"), ("000002", 2, "at open")):
        spec = "tar:%sshard-%s.tar%s" % (long_base, shards, OPTS)
        want_end = "GET %sshard-%06d.tar: HTTP 404: 404 Not Found" % (long_base, bad)
        rc, out, err = R.load(spec, "--workers", "0")
        T.check(rc == 1 and out["error_code"] == ENOENT and want_end in out["error"]
                and out["error"].split(want_end)[1] in ("", " (STOKE_ENOENT)")
                and want_end in err, "long URL, %s: stoke load: %s" % (when, out["error"]))
        try:
            for b in stoke.DataLoader(spec, batch_size=4, structure="list", num_workers=0):
                pass
            T.check(False, "long URL, %s: loaded" % when)
        except stoke.StokeError as e:  # at open: StokeError; in the epoch: LoaderError
            text = str(e)
            text = text[:-len(" (STOKE_ENOENT)")] if text.endswith(" (STOKE_ENOENT)") else text
            T.check(getattr(e, "code", ENOENT) == ENOENT and text.endswith(want_end),
                    "long URL, %s: %s: %s" % (when, type(e).__name__, e))
        print("long URL (%d characters), %s: %d-character message ends with: %s"
              % (len(long_base), when, len(out["error"]), out["error"][-60:]))
    loader = stoke.DataLoader("tar:%sshard-{000000..000001}.tar%s" % (long_base, OPTS),
                              batch_size=4, structure="list", num_workers=2, on_error="skip")
    got = rows(list(loader))
    q = loader.quarantine()
    want_end = "GET %sshard-000001.tar: HTTP 404: 404 Not Found" % long_base
    T.check(got == want[0] and len(q) == PER
            and all(e["code"] == ENOENT and e["reason"].endswith(want_end) for e in q),
            "long URL, skip: %d samples, quarantine %s" % (len(got), q[:1]))
finally:
    ng.stop()
print("remote shards failing mid-epoch: ok")
