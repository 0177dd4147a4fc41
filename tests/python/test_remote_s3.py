"""Remote tar shards from an S3 API (docs/sources.md, "Remote shards"): s3rver (npm, installed
under tests/remote/node_modules by `make deps`) started here on 127.0.0.1, a bucket filled with
generated shards (uploaded by the curl tool, signed with SigV4), read as tar:s3://BUCKET/...
through AWS_ENDPOINT_URL (path-style) with credentials from the environment or an AWS_PROFILE
of a credentials file; samples and content hashes equal to the same shards read from disk.
s3rver 3.7 checks the access key of a SigV4 request but not its signature (its
authentication.js: "Signature version 4 calculation is unimplemented"), so a wrong key id is
what is refused here.  Skips (77) without libcurl, node, s3rver or curl, saying why."""
import json
import os
import shutil
import struct
import subprocess
import sys

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

CLI = R.need_cli_and_libcurl()
if not shutil.which("curl"):
    T.skip("the curl tool is needed to fill the bucket")
NSHARDS = 3
RANGE = "shard-{000000..%06d}.tar" % (NSHARDS - 1)
AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
       "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
       "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")


def load(spec, env, *args, order=("--workers", "2", "--shuffle", "--seed", "5")):
    e = {k: v for k, v in os.environ.items() if k not in AWS}
    e.update(env)
    p = subprocess.run([CLI, "load", spec, "--json", "--batch-size", "4", "--no-pin-memory"]
                       + list(order) + list(args),
                       capture_output=True, text=True, env=e, timeout=120)
    try:
        return p.returncode, json.loads(p.stdout), p.stderr
    except ValueError:
        raise AssertionError("%s: not JSON: %r %r" % (spec, p.stdout, p.stderr))


def summary(out):
    return {k: out.get(k) for k in ("samples", "content_hash", "order_hash", "index_sum")}


work = T.tmpdir()
root = os.path.join(work, "root")
paths, _ = S.make_shards(root, nshards=NSHARDS, per_shard=10)
try:
    srv = S.start_s3rver(work, "shards")
except S.Unavailable as e:
    T.skip(str(e))
try:
    for p in paths:  # s3rver's own account: S3RVER / S3RVER
        r = subprocess.run(["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user",
                            "S3RVER:S3RVER", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                            "-T", p, srv.url("shards/train/" + os.path.basename(p))],
                           capture_output=True, text=True, env=S.server_env())
        T.check(r.returncode == 0, "upload of %s: %s" % (p, r.stderr))
    secret = "S3RVER-secret-not-to-be-printed"
    creds = {"AWS_ENDPOINT_URL": srv.url(""), "AWS_ACCESS_KEY_ID": "S3RVER",
             "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}
    for fields in ("bin:cls:txt", "txt:bin:cls", "cls:txt:bin"):
        opts = ",fields=%s,ragged=txt" % fields
        rc_l, loc, _ = load("tar:%s/%s%s" % (root, RANGE, opts), {})
        rc, rem, err = load("tar:s3://shards/train/%s%s" % (RANGE, opts), creds)
        T.check(rc_l == 0 and loc["samples"] == NSHARDS * 10, "local: %s" % loc)
        T.check(rc == 0 and summary(rem) == summary(loc),
                "s3, fields=%s: %s (%s), local %s" % (fields, summary(rem), rem.get("error"),
                                                      summary(loc)))
    OPTS = ",fields=txt:bin:cls,ragged=txt"
    local = summary(load("tar:%s/%s%s" % (root, RANGE, OPTS), {})[1])

    # sidecar indexes (test_remote_index.py): KEY.idx is another key, signed as any
    r = subprocess.run([os.environ["STOKE_CLI"], "index", "tar:%s/%s" % (root, RANGE)],
                       capture_output=True, text=True)
    T.check(r.returncode == 0, "stoke index: %s" % r.stderr)
    for p in paths:
        for f in (p, p + ".idx"):
            r = subprocess.run(["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3",
                                "--user", "S3RVER:S3RVER", "-H",
                                "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", f,
                                srv.url("shards/indexed/" + os.path.basename(f))],
                               capture_output=True, text=True, env=S.server_env())
            T.check(r.returncode == 0, "upload of %s: %s" % (f, r.stderr))
    # stoke index --out of the shards in the bucket (signed downloads): the local indexes' bytes
    outd = os.path.join(work, "idx-from-s3")
    os.makedirs(outd)
    e = {k: v for k, v in os.environ.items() if k not in AWS}
    e.update(creds)
    r = subprocess.run([os.environ["STOKE_CLI"], "index", "tar:s3://shards/train/" + RANGE,
                        "--out", outd], capture_output=True, text=True, env=e, timeout=120)
    T.check(r.returncode == 0 and "3 shards indexed" in r.stdout,
            "stoke index of s3:// shards: %s %s" % (r.stdout, r.stderr))
    for p in paths:
        with open(p + ".idx", "rb") as a, open(os.path.join(outd, os.path.basename(p) + ".idx"),
                                               "rb") as b:
            T.check(a.read() == b.read(), "%s: the index from s3 differs" % p)
    rc, walked, err = load("tar:s3://shards/train/%s%s" % (RANGE, OPTS), creds)
    rc2, indexed, err2 = load("tar:s3://shards/indexed/%s%s" % (RANGE, OPTS), creds)
    T.check(rc == 0 and rc2 == 0 and summary(indexed) == local
            and indexed["remote"]["requests"] < walked["remote"]["requests"],
            "s3 with indexes: %s (%s), without %s" % (indexed.get("remote"),
                                                     indexed.get("error"), walked.get("remote")))

    # the streaming mode over s3://: signed GETs, one per shard and epoch (each below the default
    # chunk of 4 MiB), plus the open's of shard 0's start (64 KiB, then doubling to the first
    # sample's end: at most 3 for its 300 KB at most), the same samples in the same order as the
    # local shards streamed
    for w in ("0", "2"):
        SOPTS = ",fields=bin:cls,mode=stream,shuffle_buffer=7,seed=3"
        rc_l, sloc, _ = load("tar:%s/%s%s" % (root, RANGE, SOPTS), {}, order=("--workers", w))
        rc, srem, err = load("tar:s3://shards/train/%s%s" % (RANGE, SOPTS), creds,
                             order=("--workers", w))
        T.check(rc_l == 0 and sloc["samples"] == NSHARDS * 10 and rc == 0
                and summary(srem) == summary(sloc)
                and NSHARDS + 1 <= srem["remote"]["requests"] <= NSHARDS + 3,
                "s3 stream, workers %s: %s %s (%s), local %s" % (
                    w, summary(srem), srem.get("remote"), srem.get("error"), summary(sloc)))

    # the store's refusal comes back with its code, the key's secret never
    bad = dict(creds, AWS_ACCESS_KEY_ID="NOSUCHKEY")
    rc, out, err = load("tar:s3://shards/train/%s" % RANGE, bad)
    T.check(rc == 1 and "s3://shards/train/shard-000000.tar" in out["error"]
            and "HTTP 403" in out["error"] and "InvalidAccessKeyId" in out["error"],
            "a wrong key: %s" % out["error"])
    T.check(secret not in out["error"] + err, "the secret key was printed: %s" % err)
    rc, out, err = load("tar:s3://shards/train/shard-000009.tar", creds)
    T.check(rc == 1 and "HTTP 404" in out["error"] and "NoSuchKey" in out["error"]
            and "s3://shards/train/shard-000009.tar" in out["error"], "no such key: %s" % out)

    # AWS_PROFILE: keys and region from the credentials and config files
    aws = os.path.join(work, "aws")
    os.makedirs(aws)
    with open(os.path.join(aws, "credentials"), "w") as f:
        f.write("[default]\naws_access_key_id = NOSUCHKEY\naws_secret_access_key = x\n\n"
                "[stoke-test]\naws_access_key_id = S3RVER\naws_secret_access_key = %s\n" % secret)
    with open(os.path.join(aws, "config"), "w") as f:
        f.write("[profile stoke-test]\nregion = eu-west-3\n")
    files = {"AWS_ENDPOINT_URL": srv.url(""),
             "AWS_SHARED_CREDENTIALS_FILE": os.path.join(aws, "credentials"),
             "AWS_CONFIG_FILE": os.path.join(aws, "config")}
    rc, out, err = load("tar:s3://shards/train/%s%s" % (RANGE, OPTS),
                        dict(files, AWS_PROFILE="stoke-test"))
    T.check(rc == 0 and summary(out) == local, "AWS_PROFILE=stoke-test: %s" % out.get("error"))
    rc, out, err = load("tar:s3://shards/train/%s" % RANGE, files)  # [default]: a wrong key
    T.check(rc == 1 and "InvalidAccessKeyId" in out["error"], "[default]: %s" % out)
    rc, out, err = load("tar:s3://shards/train/%s" % RANGE, dict(files, AWS_PROFILE="nosuch"))
    T.check(rc == 1 and "AWS_PROFILE=nosuch" in out["error"], "a missing profile: %s" % out)
    # HOME/.aws is where the files are by default
    home = os.path.join(work, "home")
    os.makedirs(home)
    shutil.copytree(aws, os.path.join(home, ".aws"))
    rc, out, err = load("tar:s3://shards/train/%s%s" % (RANGE, OPTS),
                        {"HOME": home, "AWS_PROFILE": "stoke-test",
                         "AWS_ENDPOINT_URL": srv.url("")})
    T.check(rc == 0 and summary(out) == local, "~/.aws: %s" % out.get("error"))

    # npy:s3:// (test_remote_npy.py has the HTTP cases): one .npy's rows by signed range reads
    npy = os.path.join(work, "rows.npy")
    d = "{'descr': '<f4', 'fortran_order': False, 'shape': (40, 6), }"
    hdr = d + " " * (63 - (10 + len(d)) % 64) + "\n"
    with open(npy, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode()
                + os.urandom(40 * 24))
    r = subprocess.run(["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user",
                        "S3RVER:S3RVER", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T",
                        npy, srv.url("shards/arrays/rows.npy")],
                       capture_output=True, text=True, env=S.server_env())
    T.check(r.returncode == 0, "upload of %s: %s" % (npy, r.stderr))
    rc_l, loc, _ = load("npy:" + npy, {})
    rc, rem, err = load("npy:s3://shards/arrays/rows.npy", creds)
    T.check(rc_l == 0 and loc["samples"] == 40 and rc == 0 and summary(rem) == summary(loc)
            and rem["remote"]["shards"] == 1,
            "npy:s3://: %s (%s), local %s" % (summary(rem), rem.get("error"), summary(loc)))
    rc, out, err = load("npy:s3://shards/arrays/nosuch.npy", creds)
    T.check(rc == 1 and "HTTP 404" in out["error"] and "s3://shards/arrays/nosuch.npy"
            in out["error"], "npy:s3:// no such key: %s" % out)
finally:
    srv.stop()
print("remote over s3: ok")
