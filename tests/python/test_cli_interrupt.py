"""stoke load interrupted by Ctrl-C while its progress bar is drawn (stderr a terminal): the bar's
line is ended before the process dies of SIGINT, so the shell's prompt starts on a line of its
own; the exit is still the signal's.  With --json, SIGINT and SIGTERM (threads and worker
processes; sent to the process or to its whole group, as a terminal's Ctrl-C) print the
failure's one {"ok": false, ...} object on stdout and its message on stderr before the process
dies of the signal (stdout was empty; the worker processes wrote the object too), also while
the bar is drawn (its line ended first)."""
import json
import os
import pty
import select
import signal
import subprocess
import time

import stoke_testlib as T

CLI = os.environ.get("STOKE_CLI")
if not CLI or not os.path.exists(CLI):
    T.skip("the stoke CLI was not built (STOKE_CLI)")

mfd, sfd = pty.openpty()
p = subprocess.Popen([CLI, "load", "synthetic:50000", "--epochs", "100000", "--workers", "1"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sfd)
os.close(sfd)
seen = b""


def read_for(secs, until=None):
    global seen
    end = time.monotonic() + secs
    while time.monotonic() < end and not (until and until(seen)):
        r, _, _ = select.select([mfd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(mfd, 65536)
            except OSError:  # the other side closed
                return
            if not chunk:
                return
            seen += chunk


try:
    read_for(60, lambda s: s.count(b"batches") >= 2)  # the bar, drawn more than once
    T.check(b"\r" in seen and b"samples/s" in seen, "no progress bar: %r" % seen[-300:])
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    read_for(2)
finally:
    if p.poll() is None:
        p.kill()
        p.wait()
    os.close(mfd)
T.check(rc == -signal.SIGINT, "exit: the signal's (got %r)" % rc)
last = seen.rstrip(b"\0")
T.check(last.endswith(b"\n") or last.endswith(b"\r\n"),
        "the bar's line is ended: %r" % last[-120:])
T.check(last.rfind(b"\n") > last.rfind(b"batches"), "the newline after the bar: %r" % last[-120:])

# --json: the failure's object on stdout (once: sent to the whole process group, as a
# terminal's Ctrl-C, each worker process and the zygote wrote it too, inheriting the handler),
# its message on stderr, then the signal's exit
for sig, mode, group in [(s, m, g) for s in (signal.SIGINT, signal.SIGTERM)
                         for m in ("threads", "processes") for g in (False, True)]:
    p = subprocess.Popen([CLI, "load", "synthetic:50000", "--epochs", "100000", "--workers",
                          "2", "--worker-mode=" + mode, "--json"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=group)
    try:
        time.sleep(1.0)
        if group:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    name = signal.Signals(sig).name
    try:
        obj = json.loads(out)
    except ValueError:
        obj = None
    T.check(p.returncode == -sig and obj is not None and obj["ok"] is False
            and obj["signal"] == name and "interrupted by " + name in obj["error"]
            and obj["source"] == "synthetic:50000" and out.count(b"\n") == 1
            and err.count(b"stoke load: interrupted by " + name.encode() + b"\n") == 1,
            "--json, %s, %s%s: exit %r, stdout %r, stderr %r"
            % (name, mode, ", to the group" if group else "", p.returncode, out,
               err[-300:]))

# the hash pass (a second, untimed pass for content_hash) draws its own line on a terminal:
# a long run's second pass was a silent pause after the bar's 100 %; then its last state, ended
mfd, sfd = pty.openpty()
p = subprocess.Popen([CLI, "load", "synthetic:100000,shape=64", "--batch-size", "4", "--epochs",
                      "2", "--no-pin-memory"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=sfd)
os.close(sfd)
seen = b""
try:
    read_for(120, lambda s: b"2 epochs," in s and s.endswith(b"\n"))
    out = p.communicate(timeout=60)[0]
finally:
    if p.poll() is None:
        p.kill()
        p.wait()
    os.close(mfd)
T.check(p.returncode == 0 and b"content_hash 0x" in out, "stoke load: %r" % out[-300:])
T.check(b"\rhash pass (--no-hash skips it): epoch 1 of 2, " in seen
        and b"\rhash pass (--no-hash skips it): 2 epochs, " in seen
        and seen.rstrip(b"\0").endswith(b"\n"), "the hash pass's line: %r" % seen[-300:])
print("ok")
