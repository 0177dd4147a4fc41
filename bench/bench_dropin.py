#!/usr/bin/python3
"""stoke.DataLoader as a drop-in for torch.utils.data.DataLoader (issue 27's benchmark).

    /usr/bin/python3 bench/bench_dropin.py [--build build] [--cases tensor,dict,...]
        [--repeat 3] [--workers 2] [--batch-size B] [--samples N]
        [--quick] [--workdir DIR] [--json [FILE]]

The same dataset object (a class defined here, its data made in memory from a fixed seed) and
the same arguments go to torch.utils.data.DataLoader(..., pin_memory=True) and to
stoke.DataLoader(...): only the class differs, except where a case says otherwise.

Cases (batch size; N samples, chosen so that an epoch takes 1-3 s for torch on 2 cores):
  tensor       TensorDataset of 3x32x32 float32 images + int64 labels (batch 256)
  dict         a map-style dataset whose __getitem__ returns a dict of 6 small tensors, as a
               tabular dataset is written: 4 float feature vectors (8, 2, 4, 16 values), an
               int64 category and a float32 target (batch 512)
  tokens       {"input_ids": int64 tokens, 16..256 of them} with the user's padding collate_fn
               (pad_sequence + lengths) on both sides (batch 32)
  tokens_pad   the same dataset; stoke pads it itself, DataLoader(ds, batch_size=32,
               pad={"input_ids": 0}); torch's side is the tokens case's (its collate_fn)
  fakedata     torchvision FakeData(image_size=(3, 224, 224)) with the ImageNet train
               transforms (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize)
               (batch 64)
  imagefolder  ImageFolder over generated JPEGs (500x375, bench_images.py's generator, kept in
               --workdir and reused), the same transforms (batch 64)
  images       the same folder through stoke's native source,
               "images:DIR,train,size=224,dtype=f32,mean=...,std=..." (the same output:
               normalized float32 CHW); torch's side is the imagefolder case's
  stream       an IterableDataset of decoded images as a streaming pipeline yields them
               (WebDataset's model): 3x224x224 float32 tensors and a label, sharded by
               get_worker_info(), 38.5 MB a batch (batch 64); no block size is given, as a
               user gives none
Every case but stream shuffles (shuffle=True); every case keeps the last partial batch.

Configurations: torch at --workers (2) and at 0 workers (torch's best of the two is reported
too), stoke at --workers.  Each run is a fresh process (bench_dropin.py --child ...) that
makes the dataset, then times the constructor + one full epoch (worker start-up included, as
it is part of an epoch's cost), touching every batch lightly: one element of every tensor is
read, the samples are counted and a checksum is taken (sum of the labels / categories / token
counts), which must agree between torch and stoke.  Per run:
  samples/s       N / (constructor + epoch)
  CPU us/sample   user + system time of the process and its children over that span and the
                  loader's teardown (getrusage SELF + CHILDREN after the loader is deleted and
                  its workers are reaped; a child still alive then is added from /proc and
                  reported)
  peak PSS        the largest sum of Pss (/proc/PID/smaps_rollup) over the run's process and
                  all its descendants, sampled every --pss-interval seconds (0.25) from a
                  thread of the benchmark's own process at nice 10, between the constructor
                  and the end of the epoch, and once more at the end with the loader live;
                  "over base" subtracts the process's PSS just before the constructor (the
                  interpreter, torch and the dataset).  The sampling's CPU is not charged to
                  the run, but it shares the 2 cores: one smaps_rollup of a torch process
                  costs ~6 ms, so sampling 3 processes every 50 ms took ~14% of the machine
                  from the runs that use both cores (stoke's and torch's 2-worker runs) and
                  none from torch's 0-worker run, whose idle core it used
Rounds: --repeat rounds per case, the order of the configurations reversed every other round
(alternating torch and stoke); the best rate and the lowest CPU per sample count, and the
highest peak PSS (the worst).  Each group also prints every configuration's median rate and
its range over the rounds, and the ratio of the medians stoke / torch (the figures to quote
on a busy machine).  --batch-size B and --samples N replace every case's batch size and
samples per epoch (small batches: --workers 0 --batch-size 8 shows the fixed costs per loader
and per batch).  A configuration that fails (a stoke without the drop-in DataLoader, an
argument it refuses) prints its error in its cell; the others go on.

Prints a table with the ratios stoke / torch at --workers and stoke / torch's best, against
issue 27's targets; --json writes every run and figure as JSON (to FILE, or with no FILE to
stdout, the table then going to stderr).  --quick: tiny sizes, one round, to test the script
(its figures mean nothing).  Needs Debian's python3-torch and python3-numpy (/usr/bin/python3);
the fakedata, imagefolder and images cases need python3-torchvision and python3-pil and are
skipped with a message without them.
"""
import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# Samples per epoch; FULL gives torch 1-3 s an epoch on the 2-core development VM.
FULL = {"tensor": 100000, "dict": 60000, "tokens": 40000, "fakedata": 640, "imagefolder": 800,
        "stream": 6400}
QUICK = {"tensor": 3000, "dict": 3000, "tokens": 2000, "fakedata": 96, "imagefolder": 96,
         "stream": 256}
BATCH = {"tensor": 256, "dict": 512, "tokens": 32, "fakedata": 64, "imagefolder": 64,
         "stream": 64}

# case -> (group: the dataset and torch's runs it shares, stoke's variant)
CASES = {"tensor": ("tensor", ""), "dict": ("dict", ""), "tokens": ("tokens", ""),
         "tokens_pad": ("tokens", "pad"), "fakedata": ("fakedata", ""),
         "imagefolder": ("imagefolder", ""), "images": ("imagefolder", "native"),
         "stream": ("stream", "")}
VISION = {"fakedata", "imagefolder"}

# issue 27's targets: (stoke / torch at --workers, stoke / torch's best); None: none set
TARGETS = {"tensor": (3.0, 1.5), "dict": (3.0, 1.5), "tokens": (2.0, None),
           "tokens_pad": (None, 3.0), "fakedata": (1.0, None), "imagefolder": (1.0, None),
           "images": (2.0, None), "stream": (None, None)}


# --- the datasets (as PyTorch users write them) -----------------------------------------------

def make_tensor(n):
    import numpy as np
    import torch
    g = np.random.default_rng(0)
    x = torch.from_numpy(g.random((n, 3, 32, 32), dtype=np.float32))
    y = torch.from_numpy(g.integers(0, 10, n, dtype=np.int64))
    return torch.utils.data.TensorDataset(x, y)


def tabular_class():
    import numpy as np
    import torch

    class Tabular(torch.utils.data.Dataset):
        """Rows of a table: six fields, read one sample at a time by __getitem__ only."""

        def __init__(self, n):
            g = np.random.default_rng(0)
            self.num = torch.from_numpy(g.standard_normal((n, 8), dtype=np.float32))
            self.geo = torch.from_numpy(g.random((n, 2), dtype=np.float32))
            self.time = torch.from_numpy(g.random((n, 4), dtype=np.float32))
            self.dense = torch.from_numpy(g.standard_normal((n, 16), dtype=np.float32))
            self.category = torch.from_numpy(g.integers(0, 50, n, dtype=np.int64))
            self.target = torch.from_numpy(g.random(n, dtype=np.float32))

        def __len__(self):
            return len(self.target)

        def __getitem__(self, i):
            return {"num": self.num[i], "geo": self.geo[i], "time": self.time[i],
                    "dense": self.dense[i], "category": self.category[i],
                    "target": self.target[i]}

    return Tabular


def tokens_class():
    import numpy as np
    import torch

    class Tokens(torch.utils.data.Dataset):
        """Token sequences of 16..256 int64 ids (1..31999: 0 is the padding)."""

        def __init__(self, n):
            g = np.random.default_rng(0)
            lengths = g.integers(16, 257, n)
            flat = g.integers(1, 32000, int(lengths.sum()), dtype=np.int64)
            self.seqs = [torch.from_numpy(s) for s in np.split(flat, np.cumsum(lengths)[:-1])]

        def __len__(self):
            return len(self.seqs)

        def __getitem__(self, i):
            return {"input_ids": self.seqs[i]}

    return Tokens


def stream_class():
    import numpy as np
    import torch

    class Stream(torch.utils.data.IterableDataset):
        """Decoded images as a streaming pipeline yields them (WebDataset's model): 3x224x224
        float32 and a label, each worker its share (get_worker_info()); 16 images made once
        and yielded in turn, so that the loaders, not the decoding, are measured.  A batch of
        64 is 38.5 MB."""

        def __init__(self, n):
            g = np.random.default_rng(0)
            self.n = n
            self.images = [torch.from_numpy(g.random((3, 224, 224), dtype=np.float32))
                           for _ in range(16)]

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            k, w = (info.id, info.num_workers) if info else (0, 1)
            for i in range(k, self.n, w):
                yield self.images[i % 16], i % 1000

    return Stream


def pad_collate(samples):
    """The user's padding collate_fn: pad to the batch's longest, with the lengths."""
    import torch
    from torch.nn.utils.rnn import pad_sequence
    ids = [s["input_ids"] for s in samples]
    return {"input_ids": pad_sequence(ids, batch_first=True, padding_value=0),
            "lengths": torch.tensor([len(t) for t in ids])}


def train_transform():
    from torchvision import transforms
    return transforms.Compose([transforms.RandomResizedCrop(224),
                               transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                               transforms.Normalize(MEAN, STD)])


def images_spec(folder):
    return "images:%s,train,size=224,dtype=f32,mean=%s,std=%s" % (
        folder, ":".join(map(str, MEAN)), ":".join(map(str, STD)))


def make_dataset(group, n, folder):
    if group == "tensor":
        return make_tensor(n)
    if group == "dict":
        return tabular_class()(n)
    if group == "tokens":
        return tokens_class()(n)
    if group == "stream":
        return stream_class()(n)
    from torchvision import datasets
    if group == "fakedata":
        return datasets.FakeData(size=n, image_size=(3, 224, 224), num_classes=1000,
                                 transform=train_transform())
    return datasets.ImageFolder(folder, transform=train_transform())


# --- one run, in its own process --------------------------------------------------------------

def touch(obj):
    """Reads one element of every tensor in the batch; returns the batch as tensors."""
    import torch
    if hasattr(obj, "__dlpack__") and not hasattr(obj, "keys"):
        obj = torch.from_dlpack(obj)
    if torch.is_tensor(obj):
        if obj.numel():
            obj.reshape(-1)[-1].item()
        return obj
    if hasattr(obj, "keys"):  # dict, or a stoke.Batch of a source string
        return {k: touch(obj[k]) for k in obj.keys()}
    if isinstance(obj, (list, tuple)):
        return [touch(x) for x in obj]
    return obj


def checksum(group, b):
    """(samples, checksum) of one touched batch; the checksum is order-free."""
    if group == "tokens":  # the tokens that are not padding
        ids = b["input_ids"]
        return ids.shape[0], int((ids != 0).sum())
    if group == "dict":
        return len(b["category"]), int(b["category"].sum())
    labels = b["label"] if isinstance(b, dict) else b[1]  # images: fields; others (x, y)
    return len(labels), int(labels.sum())


def pss_kib(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_table():
    """{pid: (ppid, session)} of every process (a scan of /proc: this kernel has no
    /proc/PID/task/TID/children)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    s = f.read()
            except OSError:
                continue
            fields = s[s.rindex(")") + 2:].split()
            table[int(name)] = (int(fields[1]), int(fields[3]))
    return table


def descendants(root):
    """Pids of root's live descendants."""
    parent = {pid: v[0] for pid, v in proc_table().items()}
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def proc_cpu_s(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        fields = s[s.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_s():
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def child(a):
    """One configuration, one epoch; prints '@start', '@end' and one JSON line on stdout."""
    import torch
    if a.side == "stoke":  # the import line: the one change a training script makes
        from stoke import DataLoader
    else:
        from torch.utils.data import DataLoader
    native = a.variant == "native"
    source = images_spec(a.folder) if native else make_dataset(a.group, a.n, a.folder)
    kwargs = {"batch_size": a.batch, "shuffle": True, "num_workers": a.workers,
              "pin_memory": True}
    if a.group == "stream":
        del kwargs["shuffle"]  # (an IterableDataset: torch refuses shuffle)
    if a.group == "tokens" and a.variant != "pad":
        kwargs["collate_fn"] = pad_collate
    if a.variant == "pad":
        kwargs["pad"] = {"input_ids": 0}
    gc.collect()
    base = pss_kib(os.getpid())
    print("@start", flush=True)
    cpu0 = cpu_s()
    t0 = time.perf_counter()
    loader = DataLoader(source, **kwargs)
    ctor = time.perf_counter() - t0
    samples = check = batches = 0
    first = None
    for b in loader:
        n, c = checksum(a.group, touch(b))
        samples += n
        check += c
        batches += 1
        if first is None:
            first = time.perf_counter() - t0
        del b
    seconds = time.perf_counter() - t0
    print("@end", flush=True)
    sys.stdin.readline()  # the driver samples the memory of the loader still alive
    t1 = time.perf_counter()
    del loader
    gc.collect()
    teardown = time.perf_counter() - t1
    alive = descendants(os.getpid())
    cpu = cpu_s() - cpu0 + sum(proc_cpu_s(p) for p in alive)
    print(json.dumps({"ok": True, "samples": samples, "batches": batches, "check": check,
                      "seconds": seconds, "constructor_s": ctor, "first_batch_s": first,
                      "teardown_s": teardown,
                      "cpu_s": cpu, "pss_base_kib": base, "children_alive": len(alive),
                      "torch": torch.__version__}), flush=True)


# --- the driver ---------------------------------------------------------------------------------

def kill_group(p):
    try:
        os.killpg(p.pid, 9)
    except OSError:
        pass


def run_one(a, group, side, workers, variant, n, folder):
    """Runs one configuration in a fresh process; returns its figures or {"error": text}."""
    cmd = [a.python, os.path.abspath(__file__), "--child", "--group", group, "--side", side,
           "--workers", str(workers), "--variant", variant, "--n", str(n),
           "--batch", str(BATCH[group]), "--folder", folder or ""]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(a.build, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    with tempfile.TemporaryFile("w+") as err:
        # its own session, so that a timeout or Ctrl-C ends its workers too
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             text=True, env=env, start_new_session=True)
        state = {"on": False, "peak": 0, "stop": False}
        lock = threading.Lock()

        def measure():
            pids = [p.pid] + descendants(p.pid)
            total = sum(pss_kib(q) for q in pids)
            with lock:
                state["peak"] = max(state["peak"], total)

        def sample():  # PSS of the run's process tree while the loader is live
            try:  # below the run's processes when the cores are busy (Linux: per thread)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except (AttributeError, OSError):
                pass
            while not state["stop"]:
                if state["on"]:
                    measure()
                time.sleep(a.pss_interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        lines = []
        deadline = time.monotonic() + a.timeout
        timer = threading.Timer(a.timeout, kill_group, (p,))
        timer.start()
        try:
            for line in p.stdout:
                line = line.strip()
                if line == "@start":
                    state["on"] = True
                elif line == "@end":  # the child waits for this sample before `del loader`
                    state["on"] = False
                    measure()
                    try:
                        p.stdin.write("\n")
                        p.stdin.flush()
                    except OSError:
                        pass
                else:
                    lines.append(line)
            rc = p.wait()
        except BaseException:
            kill_group(p)
            raise
        finally:
            p.stdin.close()
            timer.cancel()
            state["stop"] = True
            sampler.join()
        # a process of the run's session that outlived it (a worker left behind) is reported
        left = [pid for pid, v in proc_table().items() if v[1] == p.pid]
        if left:
            kill_group(p)
        err.seek(0)
        stderr = err.read()
    js = None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                js = json.loads(line)
            except ValueError:
                pass
            break
    if rc != 0 or js is None or not js.get("ok"):
        if time.monotonic() >= deadline:
            return {"error": "timed out after %d s" % a.timeout}
        tail = [x for x in stderr.strip().splitlines() if x.strip()]
        msg = tail[-1] if tail else "exit %d, no output" % rc
        return {"error": msg[-300:], "rc": rc, "stderr_tail": "\n".join(tail[-15:])}
    js["left_behind"] = len(left)
    js["peak_pss_kib"] = state["peak"]
    js["samples_per_s"] = js["samples"] / js["seconds"]
    js["cpu_us_per_sample"] = js["cpu_s"] / js["samples"] * 1e6 if js["samples"] else None
    js["stderr_tail"] = stderr.strip()[-500:]
    return js


def configs(group, cases, workers):
    """The configurations of a group that the chosen cases need: (key, side, workers, variant)."""
    out = [("torch_w%d" % w, "torch", w, "") for w in sorted({workers, 0}, reverse=True)]
    for case in cases:
        g, variant = CASES[case]
        if g == group:
            out.append((stoke_key(case, workers), "stoke", workers, variant))
    return out


def stoke_key(case, workers):
    variant = CASES[case][1]
    return "stoke%s_w%d" % ("_" + variant if variant else "", workers)


def best_of(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    return {"samples_per_s": max(r["samples_per_s"] for r in ok),
            "cpu_us_per_sample": min(r["cpu_us_per_sample"] for r in ok),
            "peak_pss_mib": max(r["peak_pss_kib"] for r in ok) / 1024,
            "over_base_mib": max(r["peak_pss_kib"] - r["pss_base_kib"] for r in ok) / 1024,
            "constructor_s": min(r["constructor_s"] for r in ok),
            "first_batch_s": min(r["first_batch_s"] or 0 for r in ok),
            "samples": ok[0]["samples"], "check": ok[0]["check"],
            "children_alive": max(r["children_alive"] for r in ok),
            "left_behind": max(r["left_behind"] for r in ok),
            "failed_runs": len(runs) - len(ok)}


def median_range(runs):
    rates = sorted(r["samples_per_s"] for r in runs if "error" not in r)
    if not rates:
        return None
    k = len(rates)
    med = rates[k // 2] if k % 2 else (rates[k // 2 - 1] + rates[k // 2]) / 2
    return {"median": med, "min": rates[0], "max": rates[-1], "runs": k}


def round_ratios(a, b):
    """(lowest, highest) of stoke / torch within each round (runs side by side)."""
    r = [x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b)
         if "error" not in x and "error" not in y]
    return (min(r), max(r)) if r else (float("nan"), float("nan"))


def fmt_cell(b):
    if "error" in b:
        return "ERROR: " + b["error"]
    s = "%11.0f %10.1f %9.0f %9.0f %7.2f %7.2f" % (
        b["samples_per_s"], b["cpu_us_per_sample"], b["peak_pss_mib"], b["over_base_mib"],
        b["constructor_s"], b["first_batch_s"])
    if b["failed_runs"]:
        s += "  (%d runs failed)" % b["failed_runs"]
    if b["children_alive"]:
        s += "  (%d children alive after del loader)" % b["children_alive"]
    if b["left_behind"]:
        s += "  (%d processes outlived the run)" % b["left_behind"]
    return s


def ratio(x, y, key="samples_per_s"):
    if "error" in x or "error" in y or not y[key]:
        return None
    return x[key] / y[key]


def fx(r):
    return "n/a" if r is None else "%.2fx" % r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="build tree: stoke is imported from BUILD/python")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ",".join(CASES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None, dest="batch_all",
                    help="every case's batch size (default: the case's own)")
    ap.add_argument("--samples", type=int, default=None, dest="n_all",
                    help="every case's samples per epoch (default: the case's own)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round: a smoke test")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "stoke_bench_dropin"),
                    help="where the JPEG folder is generated (once)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a run may take")
    ap.add_argument("--pss-interval", type=float, default=0.25,
                    help="seconds between samples of the runs' PSS (default 0.25)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="write the figures as JSON to FILE (no FILE: stdout, table to stderr)")
    # a run, in its own process
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    out = sys.stderr if a.json == "-" else sys.stdout

    def say(*args):
        print(*args, file=out, flush=True)

    a.build = os.path.abspath(a.build)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        sys.exit("unknown case(s) %s; the cases: %s" % (",".join(bad), ",".join(CASES)))
    sizes = dict(QUICK if a.quick else FULL)
    if a.n_all:
        sizes = {g: a.n_all for g in sizes}
    if a.batch_all:
        for g in BATCH:
            BATCH[g] = a.batch_all
    repeat = 1 if a.quick else a.repeat
    skipped = {}
    if any(CASES[c][0] in VISION for c in cases):
        probe = subprocess.run([a.python, "-c", "import torchvision, PIL"], capture_output=True,
                               text=True)
        if probe.returncode != 0:
            for c in cases:
                if CASES[c][0] in VISION:
                    skipped[c] = "torchvision or PIL missing (apt-get install python3-torchvision)"
            cases = [c for c in cases if c not in skipped]
    for c, why in skipped.items():
        say("skipping %s: %s" % (c, why))
    folder = None
    if any(CASES[c][0] == "imagefolder" for c in cases):
        sys.path.insert(0, HERE)
        from bench_images import generate
        folder = os.path.join(a.workdir, "imagefolder%d" % sizes["imagefolder"])
        generate(folder, sizes["imagefolder"], 10, False)
    groups = []
    for c in cases:
        if CASES[c][0] not in groups:
            groups.append(CASES[c][0])

    res = {"machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0]},
           "args": {"build": a.build, "repeat": repeat, "workers": a.workers, "quick": a.quick,
                    "python": a.python, "pss_interval": a.pss_interval}, "sizes": {g: sizes[g] for g in groups},
           "skipped": skipped, "groups": {}, "cases": {}}
    say("stoke.DataLoader vs torch.utils.data.DataLoader(pin_memory=True): %d CPUs, load %.1f, "
        "stoke from %s/python, best of %d%s" % (os.cpu_count(), os.getloadavg()[0], a.build,
                                                repeat, " (--quick: figures mean nothing)"
                                                if a.quick else ""))
    for g in groups:
        runs = {}
        cfg = configs(g, cases, a.workers)
        say("\n%s: %d samples, batch %d" % (g, sizes[g], BATCH[g]))
        for r in range(repeat):
            for key, side, w, variant in (cfg if r % 2 == 0 else cfg[::-1]):
                js = run_one(a, g, side, w, variant, sizes[g], folder)
                runs.setdefault(key, []).append(js)
                say("  round %d %-20s %s" % (r + 1, key, "%.0f samples/s" % js["samples_per_s"]
                                             if "error" not in js else "ERROR: " + js["error"]))
        best = {k: best_of(v) for k, v in runs.items()}
        spread = {k: median_range(v) for k, v in runs.items()}
        for key, m in spread.items():
            if m:
                say("  %-22s median %.0f samples/s, range %.0f-%.0f (%d runs)"
                    % (key, m["median"], m["min"], m["max"], m["runs"]))
        tk = "torch_w%d" % a.workers
        for key, m in spread.items():
            if key.startswith("stoke") and m and spread.get(tk):
                say("  %-22s median / %s median: %.2fx (ratio range over rounds %.2f-%.2f)"
                    % (key, tk, m["median"] / spread[tk]["median"],
                       *round_ratios(runs[key], runs[tk])))
        res["groups"][g] = {"runs": runs, "best": best, "median": spread}

    tw = "torch_w%d" % a.workers
    say("\n%-12s %-16s %11s %10s %9s %9s %7s %7s" % ("case", "loader", "samples/s", "CPU us/s.",
                                                     "PSS MiB", "over base", "ctor s", "first s"))
    for c in cases:
        g = CASES[c][0]
        best = res["groups"][g]["best"]
        sk = stoke_key(c, a.workers)
        t2, t0, s = best[tw], best["torch_w0"], best[sk]
        tb = max([x for x in (t2, t0) if "error" not in x], key=lambda x: x["samples_per_s"],
                 default={"error": "torch failed"})
        rows = [(tw.replace("_w", " w="), t2)] + ([("torch w=0", t0)] if a.workers else [])
        for label, b in rows + [(sk.replace("_w", " w="), s)]:
            say("%-12s %-16s %s" % (c if label.startswith("torch w=%d" % a.workers) else "",
                                    label, fmt_cell(b)))
        r2, rb = ratio(s, t2), ratio(s, tb)
        want = TARGETS[c]
        mismatch = None
        if "error" not in s and "error" not in tb and (s["samples"], s["check"]) != (
                tb["samples"], tb["check"]):
            mismatch = "stoke delivered %d samples, checksum %d; torch %d, %d" % (
                s["samples"], s["check"], tb["samples"], tb["check"])
        say("%-12s stoke / torch w=%d %s%s, / torch best %s%s; CPU per sample %s of torch "
            "w=%d, peak PSS %s" % (
                "", a.workers, fx(r2), " (target >= %.1fx)" % want[0] if want[0] else "",
                fx(rb), " (target >= %.1fx)" % want[1] if want[1] else "",
                fx(ratio(s, t2, "cpu_us_per_sample")), a.workers,
                fx(ratio(s, t2, "peak_pss_mib"))))
        if mismatch:
            say("%-12s MISMATCH: %s" % ("", mismatch))
        res["cases"][c] = {"stoke": sk, "torch_workers": tw, "vs_torch_workers": r2,
                           "vs_torch_best": rb, "targets": want,
                           "cpu_vs_torch_workers": ratio(s, t2, "cpu_us_per_sample"),
                           "pss_vs_torch_workers": ratio(s, t2, "peak_pss_mib"),
                           "mismatch": mismatch}
    say("\nsamples/s: constructor + one epoch, best of %d; CPU us/s.: user+sys microseconds "
        "per sample (process + workers), lowest; PSS: peak of the process tree, highest; "
        "ctor s / first s: seconds in the constructor / to the first batch, lowest" % repeat)
    if a.json:
        text = json.dumps(res, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
            say("figures in %s" % a.json)


if __name__ == "__main__":
    main()
