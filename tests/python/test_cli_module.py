"""python -m stoke is the stoke CLI: for devices (text and --json, without and with the simdev
plugin), load (--json over synthetic and .npy sources, through simdev to its device with
--verify, with --worker-mode=processes), version, help and errors (usage errors, a missing
file, an unknown command, stdout closed) it prints what the C tool prints and exits with its status.  load's
timings differ between any two runs; every other field must be equal."""
import json
import os
import subprocess
import sys

import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

CLI = os.environ.get("STOKE_CLI")
if not CLI or not os.path.exists(CLI):
    T.skip("the stoke CLI was not built (STOKE_CLI)")
CWD = T.tmpdir()  # not the source tree: the package comes from PYTHONPATH or site-packages
# load's fields that measure time (or follow it: batches a waiting caller made itself)
TIMED = {"seconds", "samples_per_s", "bytes_per_s", "data_wait_s", "wait_p50_s", "wait_p99_s",
         "worker_busy_s", "hash_pass_seconds", "assisted_batches", "workers_active",
         "workers_active_min", "workers_active_max", "workers_changes"}


def run(cmd, args, env):
    p = subprocess.run(cmd + list(args), cwd=CWD, env=env, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def both(args, env=None):
    e = dict(os.environ, **(env or {}))
    c = run([CLI], args, e)
    py = run([sys.executable, "-m", "stoke"], args, e)
    return c, py


def same(args, env=None, want_rc=0):
    """The same status, stdout and stderr."""
    c, py = both(args, env)
    T.check(c[0] == want_rc, "stoke %s: status %d, not %d: %s" % (args, c[0], want_rc, c[2]))
    T.check(py == c, "python -m stoke %s differs from stoke:\n  C:  %r\n  py: %r"
            % (" ".join(args), c, py))
    return c


def same_load(args, env=None):
    c, py = both(["load"] + list(args) + ["--json"], env)
    T.check(c[0] == 0 and py[0] == 0, "load %s: status %d / %d: %s / %s"
            % (args, c[0], py[0], c[2], py[2]))
    jc, jp = json.loads(c[1]), json.loads(py[1])
    T.check(list(jc) == list(jp), "load %s: other fields: %s / %s" % (args, list(jc), list(jp)))
    diff = {k: (jc[k], jp[k]) for k in jc if k not in TIMED and jc[k] != jp[k]}
    T.check(not diff, "load %s: python -m stoke differs from stoke in %s" % (args, diff))
    T.check(c[2] == py[2], "load %s: stderr differs: %r / %r" % (args, c[2], py[2]))
    return jc


simdev = os.environ.get("STOKE_SIMDEV_PLUGIN")
if not simdev or not os.path.exists(simdev):
    simdev = stoke.build_info()["simdev_plugin"]  # an installed package ships it
T.check(simdev and os.path.exists(simdev), "no simdev plugin (STOKE_SIMDEV_PLUGIN, build_info)")
SIM = {"STOKE_PLUGIN_PATH": simdev, "STOKE_ACCELERATOR": "simdev"}

# devices
same(["devices"])
same(["devices", "--json"])
_, out, _ = same(["devices", "--json"], SIM)
T.check(json.loads(out)["accelerator"]["backend"] == "simdev", "simdev not chosen: " + out)
same(["devices"], SIM)
same(["--json", "devices", "--accelerator", "simdev:1"], {"STOKE_PLUGIN_PATH": simdev})
same(["devices", "--accelerator", "nosuch", "--json"], want_rc=1)

# load
j = same_load(["synthetic:2000,shape=3x8x8", "--batch-size", "64", "--workers", "2",
               "--shuffle", "--seed", "7"])
T.check(j["samples"] == 2000 and j["batches"] == 32 and j["index_sum"] == 1999 * 2000 // 2,
        "synthetic load: %s" % j)
data, labels, dp, lp = T.make_npy(np, n=300, row_floats=96)
j = same_load(["npy:%s,labels=%s" % (dp, lp), "--batch-size", "32", "--epochs", "2",
               "--shuffle", "--drop-last", "--workers", "2"])
T.check(j["samples"] == 2 * 288 and j["content_hash"] is not None, "npy load: %s" % j)
j = same_load(["npy:" + dp, "--batch-size", "50", "--device", "simdev", "--verify",
               "--workers", "1"], SIM)
T.check(j["pinned_batches"] == 6 and j["device_copies"] == 6 and j["verified"],
        "simdev load: %s" % j)
same_load(["npy:" + dp, "--batch-size", "30", "--worker-mode=processes", "--workers", "2"])

# version, help, errors
same(["version"])
same(["version", "--json"])
same(["--help"])
same(["load", "--help"])
same([], want_rc=2)
same(["--json"], want_rc=2)
same(["frobnicate"], want_rc=2)
same(["load", "--batch-size", "0", "--json"], want_rc=2)
same(["load", "npy:" + os.path.join(CWD, "missing.npy"), "--json"], want_rc=1)
same(["load", "--workers"], want_rc=2)

# stdout closed (>&-): the C tool's write error and status, not a Python traceback
closed = []
for cmd in ([CLI], [sys.executable, "-m", "stoke"]):
    p = subprocess.run(cmd + ["version"], cwd=CWD, env=dict(os.environ), stdout=None,
                       stderr=subprocess.PIPE, text=True, timeout=60,
                       preexec_fn=lambda: os.close(1))
    closed.append((p.returncode, p.stderr))
T.check(all(rc == 1 and err.startswith("stoke: error writing output: ")
            and "Traceback" not in err for rc, err in closed),
        "stdout closed: stoke %r, python -m stoke %r" % tuple(closed))

# from Python: the same entry point, returning the status
from stoke.__main__ import main  # noqa: E402
T.check(main(["load", "--limit", "x", "--json"]) == 2, "main() did not return the status 2")
print("python -m stoke matches the stoke CLI (%s)" % CLI)
