#!/usr/bin/python3
"""stoke's images: source vs torchvision's ImageFolder + DataLoader on the same JPEG folder.

    /usr/bin/python3 bench/bench_images.py [--build BUILD] [--workdir DIR] [--images 2000]
                                           [--classes 10] [--workers 2] [--repeat 3] [--out F]
                                           [--noise]

1. Generates an ImageNet-like folder once (kept in --workdir, reused when complete; --regen
   rewrites it): IMAGES JPEGs in CLASSES class directories, 500x375 or 375x500 (one in four is
   portrait), quality 90, 4:2:0, written by PIL; the content is smooth random structure plus
   fine grain, about 82 KiB a file.  --noise makes a second, independent set instead (its own
   folder, imagefolder_noise): 450x350 or 350x450, quality 90, structure at two scales (24- and
   4-pixel cells) plus Gaussian grain (sigma 6), about 60 KiB a file: more edges and texture
   per pixel, closer to photographs' entropy.
2. Train transform, u8 output, batch 64, shuffled, `--workers` workers for both:
     stoke load images:DIR,train,size=224 --workers W --batch-size 64 --shuffle
                --no-pin-memory --no-hash --json
   against ImageFolder(DIR, Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
   PILToTensor()])) in a DataLoader(batch_size=64, shuffle=True, num_workers=W).
   Ratio = stoke / torchvision.  Target: >= 3x (>= 2.5x with --noise).
3. Per core: stoke with 1 worker (the worker thread decodes; the caller's thread helps with a
   batch when it would otherwise wait), and images per CPU-second (user + system time of the whole process, from getrusage of the
   children; for torchvision, of its Python process and its workers): on a shared machine
   the CPU-second figure is the one that does not depend on what else runs.  Target: >= 400.
4. Also f32 normalized output (dtype=f32,mean=..,std=..) against ToTensor()+Normalize(...).
5. The decoder's limit: build/bench/bench_decode (bench/bench_decode.c) decodes the same files
   with libjpeg-turbo alone at stoke's DCT scale, column crop and rows (the train crops of
   epoch 0, seed 0: the ones `stoke load` decodes), one thread, from memory, no resampling;
   stoke's images per CPU-second as a fraction of that (target >= 0.8), and the probe's own
   figure for stoke's decode + resample on one thread (no loader, no file reads).
6. The same JPEGs packed as WebDataset tar shards (500 samples a shard, members NNNNNN.jpg and
   NNNNNN.cls in the folder's canonical order, written once with Python's tarfile, ustar):
     stoke load tar:WORKDIR/shards/shard-{000000..00000K}.tar,fields=jpg:cls,train,size=224 ...

Each configuration runs once untimed (warm-up: page cache, imports), then --repeat rounds in
which every configuration runs once, in turn (alternating: stoke and torchvision, folder and tar
see the same minutes of the machine); each configuration's best run counts.  Prints a table and writes the figures as JSON (--out,
default WORKDIR/bench_images.json).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def noisy_image(rng, w, h):
    """--noise: random structure at two scales plus grain (about 60 KiB at 450x350, q90)."""
    import numpy as np
    from PIL import Image

    def layer(cell, amp):
        c = rng.random((h // cell + 2, w // cell + 2, 3)) * 255
        img = Image.fromarray(c.astype(np.uint8)).resize((w + 2 * cell, h + 2 * cell),
                                                         Image.BICUBIC)
        return (np.asarray(img, dtype=np.float32)[cell:cell + h, cell:cell + w] - 128) * amp

    a = 128 + layer(24, 1.0) + layer(4, 0.3)
    a += rng.normal(0, 6, a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def generate(root, n, classes, regen, noise=False):
    import numpy as np
    from PIL import Image

    stamp = os.path.join(root, ".complete")
    want = f"{n} {classes} " + ("noise v1" if noise else "v2")
    if not regen and os.path.exists(stamp) and open(stamp).read() == want:
        return
    rng = np.random.default_rng(4321 if noise else 1234)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c:03d}"), exist_ok=True)
    for i in range(n):
        if noise:
            w, h = (350, 450) if i % 4 == 3 else (450, 350)
            a = noisy_image(rng, w, h)
        else:
            w, h = (375, 500) if i % 4 == 3 else (500, 375)
            coarse = rng.random((h // 16 + 2, w // 16 + 2, 3)) * 255
            img = Image.fromarray(coarse.astype(np.uint8)).resize((w + 32, h + 32),
                                                                  Image.BICUBIC)
            a = np.asarray(img, dtype=np.float32)[16:16 + h, 16:16 + w]
            a += rng.normal(0, 12, a.shape)
            a = np.clip(a, 0, 255).astype(np.uint8)
        path = os.path.join(root, f"class{i % classes:03d}", f"img{i:06d}.jpg")
        Image.fromarray(a).save(path, quality=90)
    with open(stamp, "w") as f:
        f.write(want)


def pack_shards(root, outdir, per_shard=500):
    """The folder's JPEGs as tar shards (canonical order: classes, then files, sorted);
    returns the tar: pattern.  Reused when complete."""
    import tarfile
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = [(c, os.path.join(root, c, f)) for c in classes
             for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith(".jpg")]
    nshards = (len(files) + per_shard - 1) // per_shard
    pattern = os.path.join(outdir, "shard-{%06d..%06d}.tar" % (0, nshards - 1))
    done = os.path.join(outdir, "complete-%d" % len(files))
    if os.path.exists(done):
        return pattern
    os.makedirs(outdir, exist_ok=True)
    for s in range(nshards):
        with tarfile.open(os.path.join(outdir, "shard-%06d.tar" % s), "w",
                          format=tarfile.USTAR_FORMAT) as t:
            for i in range(s * per_shard, min(len(files), (s + 1) * per_shard)):
                c, path = files[i]
                t.add(path, arcname="%06d.jpg" % i)
                data = str(classes.index(c)).encode()
                info = tarfile.TarInfo("%06d.cls" % i)
                info.size = len(data)
                import io
                t.addfile(info, io.BytesIO(data))
    open(done, "w").close()
    return pattern


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_stoke(cli, spec, workers, batch):
    """(images/s, images per CPU-second, JSON, command line)."""
    cmd = [cli, "load", spec, "--workers", str(workers), "--batch-size", str(batch), "--shuffle",
           "--no-pin-memory", "--no-hash", "--json"]
    cpu0 = children_cpu()
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    cpu = children_cpu() - cpu0
    try:
        js = json.loads(out.stdout)
    except ValueError:
        sys.exit(f"stoke load failed: {out.stdout} {out.stderr}")
    if not js.get("ok"):
        sys.exit(f"stoke load failed: {js.get('error')}")
    return js["samples"] / js["seconds"], js["samples"] / cpu, js, " ".join(cmd)


def torch_child(root, workers, batch, f32):
    """In a child process (so that its CPU time, its workers' included, can be measured)."""
    import torch
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    tail = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)] if f32 else \
        [transforms.PILToTensor()]
    tf = transforms.Compose([transforms.RandomResizedCrop(224),
                             transforms.RandomHorizontalFlip()] + tail)
    ds = datasets.ImageFolder(root, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
    t0 = time.perf_counter()
    n = 0
    for x, y in dl:
        n += x.shape[0]
    print(json.dumps({"images": n, "seconds": time.perf_counter() - t0}))


def run_torch(root, workers, batch, f32):
    """(images/s, images per CPU-second: the whole Python process, start-up included)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", root, "--workers",
           str(workers), "--batch", str(batch)] + (["--f32"] if f32 else [])
    cpu0 = children_cpu()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    cpu = children_cpu() - cpu0
    js = json.loads(out.stdout.strip().splitlines()[-1])
    return js["images"] / js["seconds"], js["images"] / cpu


def run_probe(build, spec, repeat):
    """The decode-only limit (bench/bench_decode.c) as its JSON, or None without the probe."""
    probe = os.path.join(build, "bench", "bench_decode")
    if not os.access(probe, os.X_OK):
        return None
    out = subprocess.run([probe, spec, str(repeat)], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_decode failed: {out.stderr}")
    return json.loads(out.stdout)


def alternate(rows, repeat):
    """{key: (best wall rate, best CPU rate)}: a warm-up run of each configuration, then
    `repeat` rounds that run every configuration once, in turn."""
    for _, _, fn in rows:
        fn()  # warm-up: page cache, imports
    runs = {key: [] for key, _, _ in rows}
    for _ in range(repeat):
        for key, _, fn in rows:
            runs[key].append(fn()[:2])
    return {key: (max(r[0] for r in rs), max(r[1] for r in rs)) for key, rs in runs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workdir", default="/tmp/stoke_bench_images")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--noise", action="store_true",
                    help="the noisier set (450x350, about 60 KiB a file) instead")
    ap.add_argument("--skip-f32", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    ap.add_argument("--f32", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        return torch_child(a.torch_child, a.workers, a.batch, a.f32)
    cli = os.path.join(a.build, "stoke")
    if not os.access(cli, os.X_OK):
        sys.exit(f"no stoke CLI at {cli} (build it, or pass --build)")
    root = os.path.join(a.workdir, "imagefolder_noise" if a.noise else "imagefolder")
    generate(root, a.images, a.classes, a.regen, a.noise)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
             if f.endswith(".jpg")]
    res = {"images": len(sizes), "mean_file_bytes": sum(sizes) / len(sizes), "noise": a.noise,
           "workers": a.workers, "batch": a.batch, "cpus": os.cpu_count()}
    spec_u8 = f"images:{root},train,size=224"
    spec_f32 = spec_u8 + ",dtype=f32,mean=%s,std=%s" % (":".join(map(str, MEAN)),
                                                        ":".join(map(str, STD)))
    res["stoke_cmd"] = run_stoke(cli, spec_u8, a.workers, a.batch)[3]
    rows = [("stoke_u8", "stoke images: train u8",
             lambda: run_stoke(cli, spec_u8, a.workers, a.batch)),
            ("torch_u8", "torchvision ImageFolder+DataLoader u8 (PILToTensor)",
             lambda: run_torch(root, a.workers, a.batch, False)),
            ("stoke_u8_1worker", "stoke, 1 worker",
             lambda: run_stoke(cli, spec_u8, 1, a.batch))]
    spec_tar = "tar:%s,fields=jpg:cls,train,size=224" % pack_shards(
        root, os.path.join(a.workdir, "shards_noise" if a.noise else "shards"))
    rows += [("stoke_tar_u8", "stoke tar: shards, train u8",
              lambda: run_stoke(cli, spec_tar, a.workers, a.batch))]
    if not a.skip_f32:
        rows += [("stoke_f32", "stoke images: train f32 normalized",
                  lambda: run_stoke(cli, spec_f32, a.workers, a.batch)),
                 ("torch_f32", "torchvision ToTensor+Normalize",
                  lambda: run_torch(root, a.workers, a.batch, True))]
    print(f"{res['images']} JPEGs, mean {res['mean_file_bytes'] / 1024:.0f} KiB, "
          f"{a.workers} workers, batch {a.batch}, {res['cpus']} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    print(f"  {'configuration':<52} {'images/s':>9} {'per CPU-s':>10}")
    bests = alternate(rows, a.repeat)
    for key, label, _ in rows:
        res[key], res[key + "_per_cpu_s"] = bests[key]
        print(f"  {label:<52} {res[key]:>9.0f} {res[key + '_per_cpu_s']:>10.0f}", flush=True)
    target = 2.5 if a.noise else 3
    for kind in ["u8"] + ([] if a.skip_f32 else ["f32"]):
        res["ratio_" + kind] = res["stoke_" + kind] / res["torch_" + kind]
        res["ratio_" + kind + "_per_cpu_s"] = (res["stoke_" + kind + "_per_cpu_s"] /
                                               res["torch_" + kind + "_per_cpu_s"])
        print(f"  ratio {kind} (target >= {target}x): {res['ratio_' + kind]:.2f}x images/s, "
              f"{res['ratio_' + kind + '_per_cpu_s']:.2f}x per CPU-second")
    res["ratio_tar_u8"] = res["stoke_tar_u8"] / res["torch_u8"]
    print(f"  ratio tar shards u8 / torchvision folder: {res['ratio_tar_u8']:.2f}x images/s")
    res["tar_over_folder"] = res["stoke_tar_u8"] / res["stoke_u8"]
    res["tar_over_folder_per_cpu_s"] = res["stoke_tar_u8_per_cpu_s"] / res["stoke_u8_per_cpu_s"]
    print(f"  stoke tar shards / stoke folder (target within 5%): {res['tar_over_folder']:.2f} "
          f"images/s, {res['tar_over_folder_per_cpu_s']:.2f} per CPU-second")
    print(f"  per core (target >= 400): {res['stoke_u8_1worker']:.0f} images/s with 1 worker; "
          f"{res['stoke_u8_1worker_per_cpu_s']:.0f} images per CPU-second (1 worker), "
          f"{res['stoke_u8_per_cpu_s']:.0f} ({a.workers} workers)")
    probe = run_probe(a.build, spec_u8, a.repeat)
    if probe is None:
        print(f"  (no decode-limit probe at {a.build}/bench/bench_decode: build it)")
    else:
        lim = probe["decode_only_per_cpu_s"]
        res["decode_only_per_cpu_s"] = lim
        res["stoke_decode_1thread_per_cpu_s"] = probe["stoke_decode_per_cpu_s"]
        res["fraction_of_decode_limit"] = res["stoke_u8_per_cpu_s"] / lim
        print(f"  decoder limit (libjpeg-turbo alone, stoke's DCT scale, crop and rows, 1 thread): "
              f"{lim:.0f} images per CPU-second")
        print(f"  stoke u8 per CPU-second / decoder limit (target >= 0.8): "
              f"{res['fraction_of_decode_limit']:.2f}; stoke's decode + resample alone: "
              f"{probe['stoke_decode_per_cpu_s']:.0f} ({probe['stoke_decode_per_cpu_s'] / lim:.2f})")
        if not a.skip_f32:
            res["fraction_of_decode_limit_f32"] = res["stoke_f32_per_cpu_s"] / lim
            print(f"  stoke f32 per CPU-second / decoder limit: "
                  f"{res['fraction_of_decode_limit_f32']:.2f}")
    out = a.out or os.path.join(
        a.workdir, "bench_images_noise.json" if a.noise else "bench_images.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"figures in {out}")


if __name__ == "__main__":
    main()
