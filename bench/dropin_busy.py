"""Where a process worker's time goes in one epoch of bench_dropin.py's dict, tokens_pad or
tokens case (stoke.DataLoader, 2 process workers, a fresh process): from the worker children's
/proc/PID/schedstat, the share of their life on a CPU (oncpu), runnable but waiting for one
(runq) and blocked (the rest: waiting for a request, or in a system call), their voluntary
context switches per batch, and stats()["worker_busy_s"] / (2 x the epoch's wall time).
    PYTHONPATH=BUILD/python /usr/bin/python3 bench/dropin_busy.py CASE   (PF=N: prefetch_factor)
One JSON line; run it alternating against another build on a busy host (docs/bench.md)."""
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dropin as bd
from stoke import DataLoader

case = sys.argv[1]
group = "tokens" if case.startswith("tokens") else case
n, batch = bd.FULL[group], bd.BATCH[group]
ds = bd.make_dataset(group, n, None)
kw = {"batch_size": batch, "shuffle": True, "num_workers": 2, "pin_memory": True}
if case == "tokens":
    kw["collate_fn"] = bd.pad_collate
if case == "tokens_pad":
    kw["pad"] = {"input_ids": 0}
if os.environ.get("PF"):
    kw["prefetch_factor"] = int(os.environ["PF"])
t0 = time.perf_counter()
loader = DataLoader(ds, **kw)
samples = 0
for b in loader:
    samples += bd.checksum(group, bd.touch(b))[0]
    del b
wall = time.perf_counter() - t0
busy = loader.stats()["worker_busy_s"]
# the worker children: the zygote's (descendants whose parent is a descendant)
table = bd.proc_table()
desc = bd.descendants(os.getpid())
kids = [p for p in desc if table.get(p, (0,))[0] in desc]
hz = os.sysconf("SC_CLK_TCK")
up = float(open("/proc/uptime").read().split()[0])
run = wait = life = vol = 0.0
for p in kids:
    r, w, _ = map(int, open("/proc/%d/schedstat" % p).read().split())
    st = open("/proc/%d/stat" % p).read()
    start = int(st[st.rindex(")") + 2:].split()[19]) / hz
    run, wait, life = run + r / 1e9, wait + w / 1e9, life + up - start
    for line in open("/proc/%d/status" % p):
        if line.startswith("voluntary_ctxt_switches"):
            vol += int(line.split()[1])
nbatches = -(-n // batch)
print(json.dumps({"case": case, "samples": samples, "wall": round(wall, 3),
                  "rate": round(samples / wall), "busy_frac": round(busy / (2 * wall), 3),
                  "kids": len(kids), "oncpu": round(run / life, 3), "runq": round(wait / life, 3),
                  "blocked": round(1 - (run + wait) / life, 3),
                  "vol_per_batch": round(vol / nbatches, 2)}))
