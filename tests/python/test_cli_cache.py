"""`stoke cache ls|clear [DIR] [--json]` (docs/cli.md) on a cache directory laid out as the
remote-shard cache writes it (docs/sources.md, "The cache"): HASH-BASE copies, a HASH.part
left by a killed download (listed as left, not as being downloaded; one whose lock is held
is), lock files, and a file of someone else's.  A copy held open with a
shared flock (what a reader does) is listed in use and kept by clear; everything else of the
cache's goes, the foreign file stays.  Needs no server and no libcurl."""
import fcntl
import json
import os
import subprocess

import stoke_testlib as T

CLI = os.environ.get("STOKE_CLI")
if not CLI or not os.path.exists(CLI):
    T.skip("the stoke CLI was not built (STOKE_CLI)")
H1, H2, H3 = "0123456789abcdef" * 2, "fedcba9876543210" * 2, "00112233445566778899aabbccddeeff"


def run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("STOKE_CACHE")}
    e.update(env or {})
    p = subprocess.run([CLI, "cache"] + list(args), capture_output=True, text=True, env=e,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def write(path, n):
    with open(path, "wb") as f:
        f.write(b"x" * n)


d = os.path.join(T.tmpdir(), "cache")
os.makedirs(d)
write(os.path.join(d, H1 + "-shard-000000.tar"), 3000)
write(os.path.join(d, H2 + "-shard-000001.tar"), 5000)
os.utime(os.path.join(d, H2 + "-shard-000001.tar"), (1000000000, 1000000000))  # read long ago
write(os.path.join(d, H3 + ".part"), 700)  # a download whose process is gone (no lock held)
write(os.path.join(d, H1 + ".lock"), 0)
write(os.path.join(d, "notes.txt"), 10)  # not the cache's: never touched

# --- ls: least recently read first, totals, the cap ----------------------------------------------
rc, out, err = run("ls", d, "--json")
T.check(rc == 0, "ls: %s %s" % (out, err))
o = json.loads(out)
T.check([e["name"] for e in o["entries"]] == [H2 + "-shard-000001.tar", H1 + "-shard-000000.tar"]
        and [e["bytes"] for e in o["entries"]] == [5000, 3000] and o["count"] == 2
        and o["bytes"] == 8000 and o["partial_bytes"] == 0 and o["stale_bytes"] == 700
        and o["dir"] == d
        and o["limit_default"] is True and o["limit"] > 0
        and o["entries"][0]["atime"] == 1000000000
        and not any(e["in_use"] for e in o["entries"]), "ls --json: %s" % o)
rc, out, err = run("ls", env={"STOKE_CACHE_DIR": d, "STOKE_CACHE_LIMIT": "5M"})
T.check(rc == 0 and out.startswith("cache %s: 2 shards, 8.0 kB of a 5.2 MB cap "
                                   "(STOKE_CACHE_LIMIT); 700 bytes left by downloads that died"
                                   % d)
        and "2001-09-09 01:46:40 UTC" in out and out.count("shard-00000") == 2,
        "ls from STOKE_CACHE_DIR: %s %s" % (out, err))
rc, out, err = run("ls", "--json", env={"STOKE_CACHE_DIR": d, "STOKE_CACHE_LIMIT": "5M"})
T.check(rc == 0 and json.loads(out)["limit"] == 5 << 20
        and json.loads(out)["limit_default"] is False, "STOKE_CACHE_LIMIT: %s" % out)

# a .part whose lock a process holds is a download under way (a dead one's was listed as one)
lk = open(os.path.join(d, H2 + ".lock"), "wb")
fcntl.flock(lk, fcntl.LOCK_EX)
write(os.path.join(d, H2 + ".part"), 300)
rc, out, err = run("ls", d, "--json")
o = json.loads(out)
T.check(rc == 0 and o["partial_bytes"] == 300 and o["stale_bytes"] == 700,
        "a download under way and a dead one: %s" % o)
rc, out, err = run("ls", d)
T.check("; 300 bytes being downloaded; 700 bytes left by downloads that died" in out, out)
os.unlink(os.path.join(d, H2 + ".part"))
os.unlink(os.path.join(d, H2 + ".lock"))
lk.close()

# --- clear: a copy in use stays ------------------------------------------------------------------
held = open(os.path.join(d, H1 + "-shard-000000.tar"), "rb")
fcntl.flock(held, fcntl.LOCK_SH)
rc, out, err = run("ls", d, "--json")
T.check([e["in_use"] for e in json.loads(out)["entries"]] == [False, True], "in use: %s" % out)
rc, out, err = run("clear", d, "--json")
T.check(rc == 0 and json.loads(out) == {"ok": True, "dir": d, "removed": 1, "kept": 1},
        "clear with a copy in use: %s %s" % (out, err))
T.check(sorted(os.listdir(d)) == sorted([H1 + "-shard-000000.tar", "notes.txt",
                                         "stoke-cache.lock"]),
        "left after clear: %s" % sorted(os.listdir(d)))
held.close()
rc, out, err = run("clear", d)
T.check(rc == 0 and out == "cache %s: 1 shard removed, 0 in use kept\n" % d,
        "clear: %s %s" % (out, err))
T.check(sorted(os.listdir(d)) == ["notes.txt", "stoke-cache.lock"], "%s" % os.listdir(d))
rc, out, err = run("ls", d, "--json")
T.check(rc == 0 and json.loads(out)["count"] == 0 and json.loads(out)["bytes"] == 0, out)

# --- errors ---------------------------------------------------------------------------------------
rc, out, err = run("ls", "--json")
T.check(rc == 1 and json.loads(out)["error"] == (
    "no cache directory: give one (stoke cache ls DIR) or set STOKE_CACHE_DIR"), "no dir: %s" % out)
rc, out, err = run("clear", os.path.join(d, "missing"), "--json")
T.check(rc == 1 and "No such file or directory" in json.loads(out)["error"], "missing: %s" % out)
rc, out, err = run()
T.check(rc == 2 and "no subcommand (ls or clear)" in err and "usage: stoke cache" in err, err)
rc, out, err = run("list", "--json")
T.check(rc == 2 and json.loads(out)["error"] == "unknown subcommand 'list' (ls or clear)", out)
rc, out, err = run("ls", d, "extra")
T.check(rc == 2 and "unexpected argument 'extra'" in err, err)
rc, out, err = run("--help")
T.check(rc == 0 and out.startswith("usage: stoke cache ls|clear"), out)
print("stoke cache: ok")
