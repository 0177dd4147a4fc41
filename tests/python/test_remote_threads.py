"""Remote shards when no thread can start (a process at its limit of threads: RLIMIT_NPROC, a
container's pids.max), against nginx on 127.0.0.1.  Every pthread_create of the CLI fails
(tests/support/fail_threads.c, preloaded; STOKE_TEST_FAIL_THREADS=0).  Whole-shard downloads
(`stoke index --out`, the cache) then have no lane to run on: each is made in the thread that
wants it, with one warning, and the outcome is the one with threads: the same index files, the
same samples.  A download that fails there names its URL and curl's own words, which reach the
message through the slot's error buffer after the lane that took its handle could not start
(remote_fetch.c, fetcher_get).  Skips (77) without nginx or libcurl."""
import filecmp
import os
import subprocess
import sys

import stoke_testlib as T

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import runs as R  # noqa: E402
import servers as S  # noqa: E402

CLI = R.need_cli_and_libcurl()
SHIM = os.environ.get("STOKE_TEST_FAIL_THREADS_LIB", "")
T.check(os.path.exists(SHIM), "the preload library (STOKE_TEST_FAIL_THREADS_LIB) is missing: %r"
        % SHIM)
WARNING = "no thread could start for the downloads' connections (Resource temporarily unavailable)"
OPTS = ",fields=bin:cls"
RNG = "shard-{000000..000002}.tar"

work = T.tmpdir()
root = os.path.join(work, "root")
for sub in ("a", "b"):
    S.make_shards(os.path.join(root, sub), nshards=3)
try:  # b/'s shard 1: the connection closed without an answer (curl: "Empty reply from server")
    ng = S.start_nginx(root, os.path.join(work, "nginx"),
                       locations="location = /b/shard-000001.tar { return 444; }")
except S.Unavailable as e:
    T.skip(str(e))


def no_threads(**more):
    """The environment of a CLI run whose pthread_create always fails: the library preloaded
    before a sanitizer's runtime (which the tests of a sanitizer build preload), so that it is
    the one libstoke's calls find."""
    env = dict(os.environ)
    env.pop("STOKE_CACHE_DIR", None)
    env["LD_PRELOAD"] = ":".join([SHIM] + ([env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else []))
    if "ASAN_OPTIONS" in env:  # (its runtime is then not the first library)
        env["ASAN_OPTIONS"] += ":verify_asan_link_order=0"
    env["STOKE_TEST_FAIL_THREADS"] = "0"
    env.update(more)
    return env


def index(out, env):
    p = subprocess.run([CLI, "index", "tar:" + ng.url("a/" + RNG), "--out", out],
                       capture_output=True, text=True, env=env, timeout=120)
    T.check(p.returncode == 0, "stoke index --out %s: %s %s" % (out, p.stdout, p.stderr))
    return p.stderr


try:
    # stoke index --out: each shard downloaded whole to index it
    plain_dir, alone_dir = os.path.join(work, "idx-threads"), os.path.join(work, "idx-alone")
    os.makedirs(plain_dir)
    os.makedirs(alone_dir)
    err = index(plain_dir, dict(os.environ))
    T.check(WARNING not in err, "with threads: a warning %r" % err)
    err = index(alone_dir, no_threads())
    T.check(err.count(WARNING) == 1, "stoke index without threads: the warning not said once: %r"
            % err)
    names = sorted(os.listdir(plain_dir))
    T.check(names == ["shard-%06d.tar.idx" % k for k in range(3)], "index files: %s" % names)
    _, differ, errors = filecmp.cmpfiles(plain_dir, alone_dir, names, shallow=False)
    T.check(not differ and not errors, "index files differ without threads: %s %s"
            % (differ, errors))

    # the cache: the open downloads each index-less shard; the samples are the local shards'
    rc, local, _ = R.load("tar:%s/a/%s%s" % (root, RNG, OPTS), "--workers", "0")
    T.check(rc == 0 and local["samples"] == 36, "local run: %s" % local)
    cache = os.path.join(work, "cache-a")
    rc, out, err = R.load("tar:" + ng.url("a/" + RNG) + OPTS, "--workers", "0",
                          env=no_threads(STOKE_CACHE_DIR=cache))
    T.check(rc == 0 and R.summary(out) == R.summary(local),
            "the cache without threads: %s, local %s; %s" % (out, R.summary(local), err))
    T.check(err.count(WARNING) == 1, "the cache without threads: the warning: %r" % err)
    T.check(out["remote"]["cache_misses"] == 3, "the cache without threads: %s" % out["remote"])

    # a download that fails in the thread that wants it: its URL and curl's reason
    rc, out, err = R.load("tar:" + ng.url("b/" + RNG) + OPTS, "--workers", "0",
                          env=no_threads(STOKE_CACHE_DIR=os.path.join(work, "cache-b"),
                                         STOKE_REMOTE_RETRIES="0"))
    T.check(rc == 1 and out["ok"] is False and out["error_name"] == "STOKE_EIO",
            "a closed connection: %s %s" % (out, err))
    T.check(ng.url("b/shard-000001.tar") in out["error"]
            and "Empty reply from server" in out["error"],
            "a closed connection: the message lacks the URL or curl's words: %r" % out["error"])
finally:
    ng.stop()
print("ok")
