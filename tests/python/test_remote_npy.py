"""Single .npy files over HTTP (docs/sources.md, "Remote data": npy:http://...), against nginx
started here on 127.0.0.1: u8 rows of 3x16x16 with and without i64 labels, and big-endian f4 rows
(byte-swapped as the local path swaps them), each run compared with the same file read from
disk through the CLI (samples, content_hash, order_hash, index_sum) for 0, 1 and 2 worker
threads, a shuffle, worker processes, batch sizes 1 and 37; nginx's access log shows range
requests, one per sample with batches of 1 and one per run of consecutive rows with batches of
37; a missing file names the URL and the status; a file shorter than its header says, and one
truncated while it is loaded, are errors, and so is one rewritten to the same size with other
bytes (and another mtime: nginx's ETag is "mtime-size") after the open: "changed since the
open", its ETag named (its rows were read from the new file, silently).  Skips (77) when nginx or
the build's libcurl is missing, saying why."""
import os
import random
import struct
import sys
import warnings

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402
from runs import load  # noqa: E402

CLI = R.need_cli()
N = 100
ROW = 3 * 16 * 16  # bytes of a row of x.npy: the file (76,928 bytes) is longer than the open's
#                    first request (65,548)


def write_npy(path, descr, shape, data):
    """A .npy (format 1.0) holding the raw bytes `data` in C order."""
    dims = "%d," % shape[0] if len(shape) == 1 else ", ".join("%d" % s for s in shape)
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    hdr = d + " " * (63 - (10 + len(d)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + data)


work = T.tmpdir()
root = os.path.join(work, "root")
os.makedirs(root, exist_ok=True)
rnd = random.Random(30)
write_npy(os.path.join(root, "x.npy"), "|u1", (N, 3, 16, 16), rnd.randbytes(N * ROW))
write_npy(os.path.join(root, "y.npy"), "<i8", (N,),
          b"".join(rnd.randrange(10).to_bytes(8, "little") for _ in range(N)))
write_npy(os.path.join(root, "f.npy"), ">f4", (N, 5),
          b"".join(struct.pack(">f", rnd.uniform(-1, 1)) for _ in range(N * 5)))
# a header of N rows over the data of N // 2
write_npy(os.path.join(root, "short.npy"), "|u1", (N, 16), rnd.randbytes(N // 2 * 16))

R.refused_without_libcurl("npy:http://127.0.0.1:1/x.npy")

try:
    ng = S.start_nginx(root, os.path.join(work, "nginx"))
except S.Unavailable as e:
    T.skip(str(e))
log_dir = os.path.join(work, "nginx")
SPECS = [("x.npy", ""), ("x.npy", ",labels={}y.npy"), ("f.npy", "")]


def same_as_local(what, *args):
    """Each of SPECS read from disk and from nginx with args: the same summary.  Returns the
    remote runs' --json objects."""
    runs = []
    for name, labels in SPECS:
        rc_l, loc, _ = load("npy:%s/%s%s" % (root, name, labels.format(root + "/")), *args)
        rc_r, rem, err = load("npy:%s%s" % (ng.url(name), labels.format(ng.url(""))), *args)
        T.check(rc_l == 0 and loc["samples"] == N and loc["remote"] is None,
                "local run %s %s: %s" % (name, args, loc))
        T.check(rc_r == 0, "%s %s%s %s: failed: %s %s" % (what, name, labels, args,
                                                          rem.get("error"), err[-800:]))
        T.check(R.summary(rem) == R.summary(loc), "%s %s%s %s: remote %s, local %s" % (
            what, name, labels, args, R.summary(rem), R.summary(loc)))
        T.check(rem.get("io") == "remote", "%s: io %r" % (what, rem.get("io")))
        T.check(rem["remote"] and rem["remote"]["shards"] == (2 if labels else 1)
                and rem["remote"]["requests"] > 0, "counters: %s" % rem["remote"])
        runs.append(rem)
    return runs


try:
    for bs in ("1", "37"):
        same_as_local("workers 0", "--workers", "0", "--batch-size", bs)
        same_as_local("workers 1", "--workers", "1", "--batch-size", bs)
        same_as_local("workers 2, shuffled", "--workers", "2", "--shuffle", "--seed", "7",
                      "--batch-size", bs)
    # a block shuffle: the rows of a block in one request per batch (no block read-ahead)
    same_as_local("block shuffle", "--workers", "2", "--shuffle=block:10:4", "--seed", "5",
                  "--batch-size", "37")
    if not os.environ.get("STOKE_PY_TSAN"):  # TSan's lock detector: not across this fork
        same_as_local("worker processes", "--workers", "2", "--shuffle", "--seed", "3",
                      "--worker-mode=processes", "--batch-size", "37")
    else:
        print("not run under TSan: the worker-process case (%s)" % os.environ["STOKE_PY_TSAN"])

    # --- requests: range reads; one per sample, or one per run of consecutive rows ----------
    for bs, want in (("1", N), ("37", (N + 36) // 37)):
        before = len(S.access_log(log_dir))
        rc, out, err = load("npy:" + ng.url("x.npy"), "--workers", "0", "--batch-size", bs,
                            "--no-hash")
        rows = S.access_log(log_dir)[before:]
        T.check(rc == 0 and out["samples"] == N, "batch %s: %s %s" % (bs, out, err))
        T.check(all(r[2] == 206 and r[3].startswith("bytes=") and r[4] == "/x.npy"
                    for r in rows), "not all range requests answered 206: %s" % rows[:3])
        # the open's one request for the header, then the epoch's
        T.check(len(rows) == 1 + want and out["remote"]["requests"] == 1 + want,
                "batch %s: %d requests (%s), %d wanted" % (bs, len(rows), out["remote"],
                                                           1 + want))
        T.check(rows[0][3] == "bytes=0-%d" % (12 + 65536 - 1), "the open's request: %s" % (
            rows[0],))
        if bs == "37":  # rows 0-36 in one request: from the data's start, 37 rows
            T.check(rows[1][3] == "bytes=128-%d" % (128 + 37 * ROW - 1),
                    "a batch's request: %s" % (rows[1],))

    # a block shuffle's batch mixes a few blocks: the rows of each block that it holds, in
    # whatever slots, come in one request (sorted by index, read into a bounce buffer)
    before = len(S.access_log(log_dir))
    rc, out, err = load("npy:" + ng.url("x.npy"), "--workers", "0", "--batch-size", "37",
                        "--shuffle=block:10:4", "--seed", "1", "--no-hash")
    rows = S.access_log(log_dir)[before:]
    T.check(rc == 0 and out["samples"] == N and len(rows) == out["remote"]["requests"]
            and len(rows) <= 1 + N // 3, "block shuffle: %d requests for %d samples (%s)" % (
                len(rows), N, out.get("error")))

    # --- errors ------------------------------------------------------------------------------
    rc, out, err = load("npy:" + ng.url("missing.npy"))
    T.check(rc == 1 and ng.url("missing.npy") in out["error"] and "HTTP 404" in out["error"],
            "a missing file: %s" % out)
    rc, out, err = load("npy:%s,labels=%s" % (ng.url("x.npy"), ng.url("nolabels.npy")))
    T.check(rc == 1 and ng.url("nolabels.npy") in out["error"] and "HTTP 404" in out["error"],
            "missing labels: %s" % out)
    rc, out, err = load("npy:" + ng.url("short.npy"))
    T.check(rc == 1 and ng.url("short.npy") in out["error"] and "truncated" in out["error"],
            "a file shorter than its header says: %s" % out)
    rc, out, err = load("npy:%s,io=pread" % ng.url("x.npy"))
    T.check(rc == 1 and "io=pread reads local files only" in out["error"]
            and "io=remote" in out["error"], "io=pread of a URL: %s" % out)
    rc, out, err = load("npy:%s/x.npy,io=remote" % root)
    T.check(rc == 1 and "io=remote reads http://" in out["error"], "io=remote of a file: %s" % out)
    rc, out, err = load("npy:%s,labels=%s/y.npy" % (ng.url("x.npy"), root))
    T.check(rc == 1 and "both be URLs or both local files" in out["error"], "mixed: %s" % out)
    rc, out, err = load("npy:http://user:s3cret-pw@127.0.0.1:%d/missing.npy" % ng.port)
    T.check(rc == 1 and "s3cret-pw" not in out["error"] + err and "missing.npy" in out["error"],
            "credentials in a message: %s %s" % (out, err))

    # --- a file truncated while it is loaded: an error, never a crash ------------------------
    # (stoke.DataLoader: the file is cut after the first batch; later answers are short and
    # their Content-Range says the new size)
    try:
        import stoke
        import torch  # noqa: F401
    except ImportError as e:
        print("truncation while loading not run:", e)
        stoke = None
    if stoke is not None:
        cut = os.path.join(root, "cut.npy")
        write_npy(cut, "|u1", (N, 64), rnd.randbytes(N * 64))
        dl = stoke.DataLoader("npy:" + ng.url("cut.npy"), batch_size=10, num_workers=0,
                              pin_memory=False)
        it = iter(dl)
        next(it)
        with open(cut, "r+b") as f:
            f.truncate(128 + 20 * 64)
        err = None
        try:
            for _ in it:
                pass
        except stoke.LoaderError as e:
            err = str(e)
        T.check(err and "file changed while loading" in err and ng.url("cut.npy") in err,
                "a file truncated while loading: %r" % err)

        # --- rewritten to the same size, other bytes, after the open: the open's ETag (nginx's:
        # mtime-size) no longer answers; a batch's request and get()'s each fail ---------------
        same = os.path.join(root, "same.npy")
        write_npy(same, "|u1", (N, 64), rnd.randbytes(N * 64))
        for on_error in (None, "skip"):
            dl = stoke.DataLoader("npy:" + ng.url("same.npy"), batch_size=10, num_workers=0,
                                  pin_memory=False, on_error=on_error)
            when = os.stat(same).st_mtime + 10
            write_npy(same + ".new", "|u1", (N, 64), rnd.randbytes(N * 64))
            os.utime(same + ".new", (when, when))
            os.replace(same + ".new", same)
            err, got = None, 0
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # one per batch skipped
                    for b in dl:
                        got += len(memoryview(b.indices))
            except stoke.LoaderError as e:
                err = e
            if on_error is None:
                T.check(err is not None and err.code == -4 and ng.url("same.npy") in str(err)
                        and "changed since the open: its ETag is" in str(err),
                        "a file rewritten to the same size: %r" % ((err and str(err)),))
            else:
                T.check(err is None and got == 0, "a file rewritten to the same size, "
                        "on_error=skip: %d row(s) delivered, %r" % (got, err))

        # --- get(): a batch whose request fails for good is read sample by sample (the
        # loader's on_error); fault_server.py's failat/OFF fails every request starting at
        # byte OFF (row 37's), so under skip the batch's other rows come from get() ----------
        fs = S.start_fault_server(root, work)
        try:
            os.environ["STOKE_REMOTE_RETRIES"] = "1"
            url = fs.url("failat/%d/x.npy" % (128 + 37 * ROW))
            rows, idx = [], []
            for b in stoke.DataLoader("npy:" + url, batch_size=37, num_workers=0,
                                      pin_memory=False, on_error="skip"):
                rows.append(bytes(memoryview(b["data"])))
                idx += list(memoryview(b.indices))
            del os.environ["STOKE_REMOTE_RETRIES"]
            data = open(os.path.join(root, "x.npy"), "rb").read()[128:]
            T.check(idx == [i for i in range(N) if i != 37], "get() after a failed batch, "
                    "indices: %s" % idx)
            T.check(b"".join(rows) == b"".join(data[i * ROW:(i + 1) * ROW] for i in idx),
                    "get() after a failed batch: the rows differ from the file's")
        finally:
            fs.stop()
finally:
    ng.stop()
print("ok")
