#!/usr/bin/python3
"""A/B of two stoke builds on the stoke cases of bench/peers.py, alternating, for refactors.

    /usr/bin/python3 bench/ab_load.py --a OLD_BUILD --b NEW_BUILD [--rounds 5]
                                      [--workdir /tmp/stoke-bench] [--quick] [--only CASE,...]

Each case is `stoke load npy:FILE --batch-size B --workers W --shuffle --json --no-hash` as
peers.py runs it (the same files, warm), for W = 0, 2 and auto; every round runs A then B, the
next round B then A (alternating), and the medians of samples/s are compared: B / A.  A refactor
is within noise when every ratio's interval of rounds overlaps 1.  Each run also prints
order_hash and content_hash once per build with the hash pass on (--rounds does not apply),
which must be equal.  Writes the runs as JSON to WORKDIR/ab_results.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "bench")


def stoke_bin(build):
    for p in (os.path.join(build, "stoke"), os.path.join(build, "tools", "stoke")):
        if os.access(p, os.X_OK):
            return p
    sys.exit(f"ab_load: no stoke binary in {build}")


def make_npy(path, kind, rows, python):
    if os.path.exists(path):
        return
    code = ("import numpy as np, sys\nn = int(sys.argv[2]); rng = np.random.default_rng(0)\n"
            "k = sys.argv[3]\n"
            "a = (rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8) if k == 'u8' else\n"
            "     rng.integers(0, 256, (n, 3, 224, 224), dtype=np.uint8) if k == 'u8big' else\n"
            "     rng.random((n, 64), dtype=np.float32) if k == 'f32' else\n"
            "     np.arange(n, dtype=np.int64) % 10)\n"
            "np.save(sys.argv[1] + '.tmp.npy', a)\n")
    subprocess.run([python, "-c", code, path, str(rows), kind], check=True)
    os.replace(path + ".tmp.npy", path)


def warm(path):
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    j = last_json(r.stdout)
    if r.returncode != 0 or j is None:
        sys.exit(f"ab_load: {' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the old build directory")
    ap.add_argument("--b", required=True, help="the new build directory")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default="/tmp/stoke-bench")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    n, big, nf = (4000, 200, 20000) if args.quick else (100000, 5000, 1000000)
    w = args.workdir
    files = {"u8": (os.path.join(w, f"cifar_{n}.npy"), n),
             "u8big": (os.path.join(w, f"img224_{big}.npy"), big),
             "f32": (os.path.join(w, f"f32x64_{nf}.npy"), nf),
             "labels": (os.path.join(w, f"labels_{n}.npy"), n)}
    for kind, (path, rows) in files.items():
        make_npy(path, kind, rows, args.python)
    c, i, f, lab = (files[k][0] for k in ("u8", "u8big", "f32", "labels"))
    cases = [("u8_3k", "npy:" + c, 256, 0), ("u8_150k", "npy:" + i, 64, 0),
             ("f32_256", "npy:" + f, 1024, 0), ("labels", "npy:" + c + ",labels=" + lab, 256, 0),
             ("batch1", "npy:" + c, 1, 2000 if args.quick else 50000)]
    only = set(filter(None, args.only.split(",")))
    bins = {"A": stoke_bin(args.a), "B": stoke_bin(args.b)}
    results = []
    print(f"A = {bins['A']}\nB = {bins['B']}\n{args.rounds} rounds, alternating; "
          "median samples/s, B / A (min..max of the rounds' ratios)")
    for name, spec, batch, limit in cases:
        if only and name not in only:
            continue
        for workers in ("0", "2", "auto"):
            base = [spec, "--batch-size", str(batch), "--shuffle", "--json", "--workers", workers]
            if limit:
                base += ["--limit", str(max(1, limit // batch))]
            hashes = {}
            for ab in ("A", "B"):  # the hash pass once: outputs must be the same
                j = run([bins[ab], "load"] + base)
                hashes[ab] = (j.get("order_hash"), j.get("content_hash"), j.get("samples"))
            rates = {"A": [], "B": []}
            for r in range(args.rounds):
                for ab in (("A", "B") if r % 2 == 0 else ("B", "A")):
                    for path in {c, i, f, lab}:
                        if path in spec:
                            warm(path)
                    j = run([bins[ab], "load"] + base + ["--no-hash"])
                    rates[ab].append(j["samples_per_s"])
            ma, mb = statistics.median(rates["A"]), statistics.median(rates["B"])
            pairs = [b / a for a, b in zip(rates["A"], rates["B"])]
            same = hashes["A"] == hashes["B"]
            print(f"{name:8} w={workers:4}  A {ma / 1e6:8.3f} M/s  B {mb / 1e6:8.3f} M/s  "
                  f"B/A {mb / ma:5.3f} ({min(pairs):.2f}..{max(pairs):.2f})  "
                  f"hashes {'same' if same else 'DIFFER'}", flush=True)
            results.append({"case": name, "workers": workers, "a": rates["A"], "b": rates["B"],
                            "median_a": ma, "median_b": mb, "ratio": mb / ma,
                            "hashes_a": hashes["A"], "hashes_b": hashes["B"], "same": same})
    out = os.path.join(w, "ab_results.json")
    with open(out, "w") as fh:
        json.dump({"a": bins["A"], "b": bins["B"], "rounds": args.rounds, "runs": results}, fh,
                  indent=1)
    print(f"written: {out}")
    if any(not r["same"] for r in results):
        sys.exit("ab_load: the builds' outputs differ")


if __name__ == "__main__":
    main()
