"""The tar source's streaming mode over local shards (docs/sources.md, "Streaming"): no server,
so the mode is tested where nginx is missing (test_remote_stream.py has it over HTTP).  Checks
every sample once per epoch for 0/1/2 workers and 2 ranks, the order rule (stoke_permute keyed
by (seed, epoch), position i to rank i % world_size, then worker (i / world_size) % workers),
the shuffle buffer's determinism, the CLI's hashes against the map-style source, and the
refusals.  Skips (77) without torch or the CLI."""
import os
import re
import json
import subprocess
import sys

import stoke_testlib as T

T.need("torch", "stoke")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
import servers as S  # noqa: E402

import runs as R  # noqa: E402
from runs import load  # noqa: E402

CLI = os.environ.get("STOKE_CLI")
if not CLI or not os.path.exists(CLI):
    T.skip("the stoke CLI was not built (STOKE_CLI)")
NSHARDS, PER = 7, 12
work = T.tmpdir()
root = os.path.join(work, "root")
paths, _ = S.make_shards(root, nshards=NSHARDS, per_shard=PER, big=3000)
ids = R.sample_ids(paths)
SRC = "tar:%s/shard-{000000..%06d}.tar,fields=bin:cls,mode=stream" % (root, NSHARDS - 1)


def epoch(opts="", **kw):
    return R.stream_epoch(SRC + opts, ids, **kw)


# --- every sample once per epoch, for 0, 1 and 2 workers, and 2 ranks ------------------------
for w in (0, 1, 2):
    for e in (0, 1):
        R.check_stream_epoch(epoch(workers=w, epoch=e), NSHARDS, PER,
                             "workers=%d epoch %d" % (w, e))
    r0 = epoch(",rank=0,world_size=2", workers=w)
    r1 = epoch(",rank=1,world_size=2", workers=w)
    T.check(not set(r0) & set(r1), "workers=%d: the ranks share samples" % w)
    R.check_stream_epoch(r0 + r1, NSHARDS, PER, "workers=%d, ranks 0 and 1" % w)

# the CLI's --json: a stream's split is its source's, not known to stoke load: null, not 0 of 1
p = subprocess.run([CLI, "load", SRC + ",rank=1,world_size=2", "--json", "--no-pin-memory",
                    "--workers", "0"], capture_output=True, text=True, timeout=120)
j = json.loads(p.stdout)
T.check(p.returncode == 0 and j["distributed"] is False and j["rank"] is None
        and j["world_size"] is None, "stream --json: %s %s" % (p.stdout, p.stderr))

# --- determinism: same (seed, epoch) same order; another epoch or seed another ----------------
for w in (0, 2):
    a, b = epoch(",seed=5", workers=w, epoch=3), epoch(",seed=5", workers=w, epoch=3)
    T.check(a == b, "workers=%d: seed 5 epoch 3 twice: two orders" % w)
    T.check(a != epoch(",seed=5", workers=w, epoch=4), "workers=%d: epochs 3 and 4 alike" % w)
    T.check(a != epoch(",seed=6", workers=w, epoch=3), "workers=%d: seeds 5 and 6 alike" % w)
# an epoch left half way: the next one is as if it came first
T.check(R.stream_after_abandon(SRC + ",seed=5,shuffle_buffer=2", ids)
        == epoch(",seed=5,shuffle_buffer=2", workers=2, epoch=1),
        "epoch 1 after epoch 0 was left half way differs")
# the shuffle buffer mixes across shards: shards are not delivered whole
mixed = epoch(",seed=5", epoch=3)
T.check(any(mixed[k][0] != mixed[k + 1][0] for k in range(PER - 1)),
        "shuffle_buffer (default 1000): the first shard came whole: %s" % mixed[:PER])

# --- shuffle_buffer=0: whole shards in the permuted order, members in archive order ----------
orders = {}
for e in (0, 1, 2):
    got = epoch(",shuffle_buffer=0,seed=9", epoch=e)
    orders[e] = R.shard_runs(got)
    T.check(sorted(orders[e]) == list(range(NSHARDS)), "epoch %d: shards %s" % (e, orders[e]))
T.check(len({tuple(o) for o in orders.values()}) == 3, "3 epochs, not 3 orders: %s" % orders)
T.check(R.shard_runs(epoch(",shuffle_buffer=1,seed=9", epoch=1)) == orders[1],
        "shuffle_buffer=1 is not 0")
# the split: rank r takes positions r, r + 2, ...; within a rank, worker w of 2 takes every
# other of the rank's shards (one batch per shard: worker k % 2 makes batch k, in order)
for r in (0, 1):
    mine = R.shard_runs(epoch(",shuffle_buffer=0,seed=9,rank=%d,world_size=2" % r, epoch=1))
    T.check(mine == orders[1][r::2], "rank %d: %s, expected %s" % (r, mine, orders[1][r::2]))
    two = R.shard_runs(epoch(",shuffle_buffer=0,seed=9,rank=%d,world_size=2" % r, epoch=1,
                             workers=2, batch_size=PER))
    T.check(two == orders[1][r::2], "rank %d, 2 workers: %s" % (r, two))
# ranks from the environment, as the distributed sampler reads them
env_run = subprocess.run([sys.executable, "-c", (
    "import sys; sys.path.insert(0, %r); import runs as R; "
    "print(R.shard_runs(R.stream_epoch(%r, R.sample_ids(%r), epoch=1)))") % (
        os.path.dirname(R.__file__), SRC + ",shuffle_buffer=0,seed=9", paths)],
    capture_output=True, text=True, env=dict(os.environ, RANK="1", WORLD_SIZE="2"), timeout=120)
T.check(env_run.returncode == 0 and env_run.stdout.strip() == str(orders[1][1::2]),
        "RANK=1 WORLD_SIZE=2: %s %s" % (env_run.stdout, env_run.stderr[-500:]))

# --- the CLI: the same samples as the map-style source, its help names the options ----------
rc_m, m, _ = load("tar:%s/shard-{000000..%06d}.tar,fields=bin:cls" % (root, NSHARDS - 1),
                  "--workers", "2", "--epochs", "2")
for w in ("0", "2"):
    rc_s, s, err = load(SRC, "--workers", w, "--epochs", "2")
    T.check(rc_m == 0 and rc_s == 0 and s["samples"] == m["samples"] == 2 * NSHARDS * PER
            and s["content_hash"] == m["content_hash"] and s["remote"] is None,
            "CLI, workers %s: stream %s, map %s %s" % (w, R.summary(s), R.summary(m), err))
help_text = subprocess.run([CLI, "load", "--help"], capture_output=True, text=True).stdout
T.check("mode=stream" in help_text and "shuffle_buffer=N" in help_text, "help: no mode=stream")

# --- .npy members (described at open from the first sample's bytes), pax headers ----------------
import io  # noqa: E402
import tarfile  # noqa: E402

import numpy  # noqa: E402

npy_root = os.path.join(work, "npy")
os.makedirs(npy_root)
rs = numpy.random.RandomState(3)
for sh in range(3):
    fmt = tarfile.PAX_FORMAT if sh == 1 else tarfile.USTAR_FORMAT
    with tarfile.open(os.path.join(npy_root, "n-%d.tar" % sh), "w", format=fmt) as tf:
        for i in range(9):
            b = io.BytesIO()
            numpy.save(b, rs.standard_normal((3, 4)).astype(">f4" if i % 2 else "<f4"))
            for name, data in (("k%d_%d.npy" % (sh, i), b.getvalue()),
                               ("k%d_%d.cls" % (sh, i), b"%d" % i)):
                ti = tarfile.TarInfo(("d/" * 60 if sh == 1 else "") + name)  # 1: a pax path
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
NPY = "tar:%s/n-{0..2}.tar,fields=npy:cls" % npy_root
rc_m, m, _ = load(NPY, "--workers", "2")
rc_s, s, err = load(NPY + ",mode=stream,shuffle_buffer=4", "--workers", "2")
T.check(rc_m == 0 and rc_s == 0 and m["samples"] == s["samples"] == 27
        and s["content_hash"] == m["content_hash"], ".npy: stream %s, map %s %s" % (
            R.summary(s), R.summary(m), err))

# --- ragged fields: max_len= is the slot (the longest member is not known to a stream), a
# longer member a bad sample, or cut with `truncate`; the same samples as the index's ---------
import tarfile  # noqa: E402

txt = []
for p in paths:
    with tarfile.open(p) as tf:
        txt += [m.size for m in tf.getmembers() if m.name.endswith(".txt")]
TXT = "tar:%s/shard-{000000..%06d}.tar,fields=txt:bin,ragged=txt" % (root, NSHARDS - 1)
rc_m, m, _ = load(TXT, "--workers", "2")  # map: max_len is the longest member, from the index
cut = sorted(txt)[len(txt) // 2]
over = sum(n > cut for n in txt)
rc_c, c, _ = load(TXT + ",max_len=%d,truncate" % cut, "--workers", "2")
rc_l, lng, _ = load(TXT + ",max_len=%d" % cut, "--workers", "0")  # map: the member, by name
T.check(rc_l == 1 and re.search(r"tar %s/shard-0+\d+\.tar@\d+: sample '[^']+': field 'txt': \d+ "
                                "units, more than its max_len" % re.escape(root), lng["error"]),
        "map, max_len=%d, a longer member: %s" % (cut, lng.get("error")))
# a long directory: the dataset's name keeps the pattern's end (its middle cut), not its start
deep = os.path.join(work, "d" * 150)
os.symlink(root, deep)
rc_l, lng, _ = load(TXT.replace(root, deep) + ",max_len=%d" % cut, "--workers", "0")
T.check(rc_l == 1 and re.search(r"of tar:.* \.\.\. d+/shard-\{0+\.\.0+\d+\}\.tar: tar ",
                                lng["error"]),
        "a long pattern's name: %s" % lng.get("error"))
T.check(rc_m == 0 and rc_c == 0 and m["truncated_samples"] == 0 and c["samples"] == len(txt)
        and c["truncated_samples"] == over > 0 and c["content_hash"] != m["content_hash"],
        "map, max_len=%d: %s / %s" % (cut, R.summary(c), R.summary(m)))
# the text summary says it too (it said nothing: only --json had the count)
p = subprocess.run([R.CLI, "load", TXT + ",max_len=%d,truncate" % cut, "--workers", "2"],
                   capture_output=True, text=True, timeout=120)
T.check(p.returncode == 0 and "samples truncated to a ragged field's max_len: %d" % over
        in p.stdout, "text summary: %s" % p.stdout)
for w in ("0", "2"):
    rc_s, s, err = load(TXT + ",mode=stream,max_len=%d" % max(txt), "--workers", w)
    T.check(rc_s == 0 and R.summary(s)["samples"] == len(txt)
            and s["content_hash"] == m["content_hash"] and s["truncated_samples"] == 0,
            "stream, ragged=txt, max_len=longest, %s workers: %s %s" % (w, R.summary(s), err))
    rc_s, s, err = load(TXT + ",mode=stream,max_len=txt:%d,truncate,shuffle_buffer=4" % cut,
                        "--workers", w)
    T.check(rc_s == 0 and s["truncated_samples"] == over and s["content_hash"] == c["content_hash"],
            "stream, max_len=txt:%d,truncate, %s workers: %s %s" % (cut, w, R.summary(s), err))
    rc_s, s, err = load(TXT + ",mode=stream,max_len=%d" % cut, "--workers", w)
    # the message names the shard and the sample's place in it (the dataset's describe), not
    # the packed shard << 32 | position index; the dataset's name is the pattern, whole
    T.check(rc_s == 1 and "more than its max_len %d" % cut in s["error"]
            and re.search(r"tar %s/shard-0+\d+\.tar: the shard's sample \d+ \(from 0\): field "
                          "'txt'" % re.escape(root), s["error"])
            and not re.search(r"sample \d{10}", s["error"]) and ",fields" not in s["error"],
            "stream, max_len=%d, a longer member: %s" % (cut, s))
    few = sorted(txt)[-5]  # 4 longer: skipped (a batch of 5 fails with more than 5 bad)
    rc_s, s, err = load(TXT + ",mode=stream,max_len=%d" % few, "--workers", w, "--on-error",
                        "skip")
    T.check(rc_s == 0 and s["samples"] == len(txt) - 4 and s["skipped_samples"] == 4,
            "stream, max_len=%d, on_error=skip: %s %s" % (few, R.summary(s), err))
rc, out, _ = load(TXT + ",truncate")
T.check(rc == 1 and "truncate goes with max_len=N" in out["error"], "truncate alone: %s" % out)
# a .npy field ragged in its first dimension (3 rows each): rows are the units
rc_s, s, err = load(NPY + ",ragged=npy,mode=stream,max_len=npy:3", "--workers", "2")
T.check(rc_s == 0 and s["samples"] == 27 and s["content_hash"] == m_npy_ragged["content_hash"]
        if (m_npy_ragged := load(NPY + ",ragged=npy", "--workers", "2")[1]) else False,
        ".npy ragged, stream, max_len=3: %s / %s %s" % (R.summary(s), m_npy_ragged, err))
rc_s, s, err = load(NPY + ",ragged=npy,mode=stream,max_len=2,truncate", "--workers", "2")
T.check(rc_s == 0 and s["samples"] == 27 and s["truncated_samples"] == 27,
        ".npy ragged, stream, max_len=2,truncate: %s %s" % (R.summary(s), err))

# a rank past the shards: its epochs are empty, with a warning (it was silent: under DDP the
# other ranks' collectives wait for ever on it)
rc, out, err = load(SRC + ",rank=%d,world_size=%d" % (NSHARDS, NSHARDS + 1))
T.check(rc == 0 and out["samples"] == 0 and "splits %d shards across %d ranks: rank %d gets "
        "none" % (NSHARDS, NSHARDS + 1, NSHARDS) in err, "a rank past the shards: %s %s"
        % (R.summary(out), err[-300:]))
rc, out, err = load(SRC + ",rank=%d,world_size=%d" % (NSHARDS - 1, NSHARDS + 1))
T.check(rc == 0 and out["samples"] == PER and "gets none" not in err,
        "the last rank with a shard: %s %s" % (R.summary(out), err[-300:]))

# --- refusals -------------------------------------------------------------------------------
for opts, want in ((",ragged=bin", "need max_len=N"), (",rank=0", "go together"),
                   (",ragged=bin,max_len=0", "a count from 1"),
                   # (a number that does not parse: the count's message, not "not a field")
                   (",ragged=bin,max_len=-1", "max_len=-1: a count from 1"),
                   (",ragged=bin,max_len=5x", "max_len=5x: a count from 1"),
                   (",ragged=bin,max_len=cls:5", "'cls' is not a ragged or packed field"),
                   (",max_len=5", "is for ragged= and packed= fields"),
                   (",rank=2,world_size=2", "not below world size"),
                   (",shuffle_buffer=x", "shuffle_buffer=x"), (",mode=fast", "stream or map"),
                   (",shuffle_buffer=16777217", "at most")):
    rc, out, _ = load(SRC + opts)
    T.check(rc == 1 and want in out["error"], "%s: %s" % (opts, out))
rc, out, _ = load(SRC, "--shuffle")
T.check(rc == 1 and "shuffle and samplers do not apply" in out["error"], "--shuffle: %s" % out)
# --- resume mid-epoch (state_dict after k batches, a new loader restored from it): the
# batches before k and after it are, hash for hash, an uninterrupted epoch's, for every k
import hashlib  # noqa: E402

import stoke  # noqa: E402

RSRC = SRC + ",seed=5,shuffle_buffer=4"


def rloader(w):
    return stoke.DataLoader(RSRC, batch_size=5, num_workers=w, structure="list",
                            pin_memory=False)


def hashes(it, k=None):
    out = []
    for b in it:
        out.append(hashlib.sha256(b"".join(bytes(f.numpy()) for f in b)).hexdigest())
        if len(out) == k:
            break
    return out


for w in (0, 1, 2):
    dl = rloader(w)
    dl.set_epoch(1)
    full = hashes(dl)
    T.check(len(full) >= NSHARDS * PER // 5, "workers=%d: %d batches" % (w, len(full)))
    for k in range(len(full) + 1):
        a = rloader(w)
        a.set_epoch(1)
        head = hashes(a, k) if k else []
        state = a.state_dict()
        del a
        b = rloader(w)
        b.load_state_dict(state)
        got = head + hashes(b)
        T.check(got == full, "workers=%d, resumed after %d batches (state %s): %d batches, "
                "first difference at %s" % (w, k, state, len(got), next(
                    (i for i, (x, y) in enumerate(zip(got, full)) if x != y), "the end")))
        del b
# a state saved with 2 workers restored with 1: refused, naming both counts
dl = rloader(2)
it = iter(dl)
next(it)
state = dl.state_dict()
del it, dl
try:
    rloader(1).load_state_dict(state)
    T.check(False, "a 2-worker state restored into a 1-worker loader")
except Exception as e:  # noqa: BLE001 (the binding's error type is not the point)
    T.check("with 2 workers" in str(e) and "has 1" in str(e), "other workers: %s" % e)

# --- a truncated shard: a bad sample naming it; skip goes on with the next shard -------------
bad_root = os.path.join(work, "bad")
os.makedirs(bad_root)
for i, p in enumerate(paths):
    data = open(p, "rb").read()
    open(os.path.join(bad_root, os.path.basename(p)), "wb").write(data[:9000] if i == 2 else data)
BAD = "tar:%s/shard-{000000..%06d}.tar,fields=bin:cls,mode=stream" % (bad_root, NSHARDS - 1)
rc, out, _ = load(BAD, "--workers", "2")
# (the dataset's own message, with where the sample is from its describe, the shard said once)
T.check(rc == 1 and "shard-000002.tar: the shard's sample " in out["error"]
        and "truncated" in out["error"] and out["error"].count("shard-000002.tar") == 1,
        "a truncated shard: %s" % out.get("error"))
rc, out, _ = load(BAD, "--workers", "2", "--on-error=skip", "--no-hash")
q = str(out.get("quarantine"))
T.check(rc == 0 and (NSHARDS - 1) * PER <= out["samples"] < NSHARDS * PER
        and "shard-000002.tar" in q, "skip: %s" % {k: out.get(k) for k in ("samples", "error")})
# --- a share whose last samples are bad: counted (quarantine, budget) as in map mode; the batch
# that would have carried them was dropped with them, uncounted, and skip:0 passed -----------
import io  # noqa: E402
import tarfile  # noqa: E402

only = os.path.join(work, "onlybad.tar")
with tarfile.open(only, "w", format=tarfile.USTAR_FORMAT) as t:
    for name, data in [("%s.cls" % k, b"7") for k in "abcde"] + [("f.cls", b"notanumber")]:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
for mode in ("", ",mode=stream"):
    rc, out, _ = load("tar:%s%s" % (only, mode), "--on-error=skip", "--no-hash")
    # (batches of 5: the bad sample alone in the share's last batch)
    T.check(rc == 0 and out["samples"] == 5 and out["bad_samples"] == 1
            and "'f'" in str(out.get("quarantine")), "a last bad sample%s: %s" % (mode, out))
    rc, out, _ = load("tar:%s%s" % (only, mode), "--on-error=skip:0", "--no-hash")
    T.check(rc == 1 and "too many bad samples" in out["error"],
            "a last bad sample, skip:0%s: %s" % (mode, out.get("error")))
# ... counted in delivery order: with a consumer slower than the worker, the last batch's bad
# sample was counted when the worker finished it, before those of the batches delivered
# earlier (listed first in the quarantine; a fractional budget judged against the samples
# delivered so far: "the budget is 0")
import time  # noqa: E402
import warnings  # noqa: E402

import stoke  # noqa: E402

two = os.path.join(work, "twobad.tar")
with tarfile.open(two, "w", format=tarfile.USTAR_FORMAT) as t:
    for name, data in [("s%02d.cls" % k, b"bad" if k == 12 else b"7") for k in range(21)] + [
            ("z.cls", b"bad")]:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (a warning per skipped sample)
    dl = stoke.DataLoader("tar:%s,mode=stream,shuffle_buffer=1" % two, batch_size=5,
                          num_workers=1, on_error="skip:10%", prefetch_factor=8,
                          pin_memory=False)
    n = 0
    for b in dl:
        n += len(b)
        time.sleep(0.1)
    order = [q["reason"].split("'")[1] for q in dl.quarantine()]
T.check(n == 20 and order == ["s12", "z"], "slow consumer: %d samples, quarantine %s" % (n, order))
del dl
print("tar streaming, local shards: ok")
