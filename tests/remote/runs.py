"""`stoke load` runs for the remote-shard tests (tests/python/test_remote*.py): the opening
they share (setup: shards served by nginx), one run as (returncode, the --json object, stderr),
and the comparison of a remote run with the same shards read from disk."""
import json
import os
import subprocess
import time

import stoke_testlib as T

CLI = os.environ.get("STOKE_CLI")
ORDERS = ["bin:cls:txt", "txt:bin:cls", "cls:txt:bin"]  # each field first once: all bytes
CACHE_ENV = ("STOKE_CACHE_DIR", "STOKE_CACHE_LIMIT")  # a run has them only when env gives them


def need_cli():
    """Returns the CLI's path, or skips (77) when it was not built."""
    if not CLI or not os.path.exists(CLI):
        T.skip("the stoke CLI was not built (STOKE_CLI)")
    return CLI


def without_libcurl():
    features = os.environ.get("STOKE_BUILD_FEATURES")
    return features is not None and "libcurl" not in features.split(",")


def need_cli_and_libcurl():
    """Returns the CLI's path, or skips (77): the CLI was not built, or was built without
    libcurl (test_remote.py checks that refusal)."""
    need_cli()
    if without_libcurl():
        T.skip("built without libcurl (test_remote.py checks the refusal)")
    return CLI


def refused_without_libcurl(spec):
    """In a build without libcurl: checks that `spec` (a URL source) is refused naming the
    library, then skips (77).  Does nothing in a build with it."""
    if not without_libcurl():
        return
    rc, out, err = load(spec)
    T.check(rc == 1 and "built without libcurl (Debian libcurl4-openssl-dev)" in out["error"],
            "without libcurl: %s %s" % (out, err))
    T.skip("built without libcurl (checked: %s is refused naming the library)" % spec)


class Setup:
    """What setup() made: cli (the CLI's path), work (the test's directory), root (the shards'
    directory, nginx's root), paths (the shards, in order), rng (their pattern,
    "shard-{000000..N-1}.tar"), ngdir (nginx's prefix: its logs) and ng (nginx, serving root)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def setup(nshards, index=False):
    """The opening of the cache tests: the CLI with libcurl (else a skip, 77), nshards shards
    (servers.make_shards) in root under a new test directory, their sidecar indexes written with
    `stoke index` when index, and nginx serving root (else a skip saying why).  The caller stops
    setup().ng."""
    import servers as S  # tests/remote, beside this file
    cli = need_cli_and_libcurl()
    work = T.tmpdir()
    root = os.path.join(work, "root")
    paths, _ = S.make_shards(root, nshards=nshards)
    rng = "shard-{000000..%06d}.tar" % (nshards - 1)
    if index:
        p = subprocess.run([cli, "index", "tar:" + os.path.join(root, rng)], capture_output=True,
                           text=True, timeout=120)
        T.check(p.returncode == 0, "stoke index: %s" % p.stderr)
    ngdir = os.path.join(work, "nginx")
    try:
        ng = S.start_nginx(root, ngdir)
    except S.Unavailable as e:
        T.skip(str(e))
    return Setup(cli=cli, work=work, root=root, paths=paths, rng=rng, ngdir=ngdir, ng=ng)


def load(spec, *args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run([CLI, "load", spec, "--json", "--batch-size", "5", "--no-pin-memory"]
                       + list(args), capture_output=True, text=True, env=e, timeout=timeout)
    if os.environ.get("STOKE_TEST_TIMES"):
        print("%.2f s  %s %s" % (time.monotonic() - t0, spec, " ".join(args)))
    try:
        out = json.loads(p.stdout)
    except ValueError:
        raise AssertionError("%s: not JSON: %r %r" % (spec, p.stdout, p.stderr))
    return p.returncode, out, p.stderr


def summary(out):
    return {k: out[k] for k in ("samples", "content_hash", "order_hash", "index_sum")}


def same_as_local(base, local_root, rng, what, *args, env=None, orders=ORDERS, samples=None):
    """Runs tar:BASE+RNG and tar:LOCAL_ROOT/RNG with each field order and the same arguments:
    the same samples, content hash, order hash and index sum.  Returns the remote runs."""
    runs = []
    for fields in orders:
        opts = ",fields=%s,ragged=txt" % fields
        rc_l, loc, _ = load("tar:%s/%s%s" % (local_root, rng, opts), *args)
        rc_r, rem, err = load("tar:%s%s%s" % (base, rng, opts), *args, env=env)
        T.check(rc_l == 0 and (samples is None or loc["samples"] == samples)
                and loc["remote"] is None, "local run: %s" % loc)
        T.check(rc_r == 0, "%s, fields=%s: failed: %s %s" % (what, fields, rem.get("error"), err))
        T.check(summary(rem) == summary(loc), "%s, fields=%s %s: remote %s, local %s"
                % (what, fields, args, summary(rem), summary(loc)))
        runs.append(rem)
    return runs


# ---- the streaming mode (tests/python/test_tar_stream.py, test_remote_stream.py) --------------

def sample_ids(paths):
    """{the bytes of a sample's .bin member: (shard, position in the shard)} of local shards
    (make_shards: every .bin is 2000 random bytes, so each identifies its sample)."""
    import tarfile
    ids = {}
    for s, p in enumerate(paths):
        with tarfile.open(p) as tf:
            bins = [m for m in tf.getmembers() if m.name.endswith(".bin")]
            for i, m in enumerate(bins):
                ids[tf.extractfile(m).read()] = (s, i)
    return ids


def stream_epoch(spec, ids, epoch=0, workers=0, batch_size=5):
    """The samples of one epoch of source `spec` (Python's stoke.DataLoader, fields=bin:cls
    expected in spec) as (shard, position) in delivered order; a sample not in ids fails."""
    import stoke
    dl = stoke.DataLoader(spec, batch_size=batch_size, num_workers=workers, structure="list",
                          pin_memory=False)
    dl.set_epoch(epoch)
    out = []
    for b in dl:
        for row in b[0]:
            key = bytes(row.numpy())
            T.check(key in ids, "%s: a sample that is in no shard" % spec)
            out.append(ids[key])
    return out


def check_stream_epoch(got, nshards, per_shard, what):
    """got (stream_epoch's) has every sample of the shards exactly once."""
    want = sorted((s, i) for s in range(nshards) for i in range(per_shard))
    T.check(sorted(got) == want, "%s: %d samples, %d distinct, %d expected" % (
        what, len(got), len(set(got)), len(want)))


def shard_runs(got):
    """got (an unshuffled stream_epoch) as its shards in order, checking that each shard's
    samples come together and in archive order."""
    order = []
    for k, (s, i) in enumerate(got):
        if k == 0 or got[k - 1][0] != s:
            T.check(s not in order and i == 0, "shard %d comes in pieces: %s" % (s, got))
            order.append(s)
        else:
            T.check(got[k - 1][1] == i - 1, "shard %d not in archive order: %s" % (s, got))
    return order


def stream_after_abandon(spec, ids, workers=2, batch_size=5):
    """Epoch 1 of `spec` (as stream_epoch's) read by a loader that left epoch 0 after two
    batches (its workers' shards half read, their shuffle buffers full): set_epoch restarts."""
    import stoke
    dl = stoke.DataLoader(spec, batch_size=batch_size, num_workers=workers, structure="list",
                          pin_memory=False)
    it = iter(dl)
    next(it)
    next(it)
    dl.set_epoch(1)
    return [ids[bytes(row.numpy())] for b in dl for row in b[0]]
