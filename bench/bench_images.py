#!/usr/bin/python3
"""stoke's images: source vs torchvision's ImageFolder + DataLoader on the same JPEG folder.

    /usr/bin/python3 bench/bench_images.py [--build BUILD] [--workdir DIR] [--images 2000]
                                           [--classes 10] [--workers 2] [--repeat 3] [--out F]

1. Generates an ImageNet-like folder once (kept in --workdir, reused when complete; --regen
   rewrites it): IMAGES JPEGs in CLASSES class directories, 500x375 or 375x500 (one in four is
   portrait), quality 90, 4:2:0, written by PIL; the content is smooth random structure plus
   fine grain, about 100 KB a file like ImageNet's photos.
2. Train transform, u8 output, batch 64, shuffled, `--workers` workers for both:
     stoke load images:DIR,train,size=224 --workers W --batch-size 64 --shuffle
                --no-pin-memory --no-hash --json
   against ImageFolder(DIR, Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
   PILToTensor()])) in a DataLoader(batch_size=64, shuffle=True, num_workers=W).
   Ratio = stoke / torchvision.  Target: >= 3x.
3. Per core: stoke with 1 worker (the worker thread decodes, the caller's thread only waits).
   Target: >= 400 images/s.
4. Also f32 normalized output (dtype=f32,mean=..,std=..) against ToTensor()+Normalize(...).

Each configuration runs --repeat times after one untimed warm-up (page cache); the best run
counts (the machine may be shared).  Prints a table and writes the figures as JSON (--out,
default WORKDIR/bench_images.json).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def generate(root, n, classes, regen):
    import numpy as np
    from PIL import Image

    stamp = os.path.join(root, ".complete")
    want = f"{n} {classes} v2"
    if not regen and os.path.exists(stamp) and open(stamp).read() == want:
        return
    rng = np.random.default_rng(1234)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c:03d}"), exist_ok=True)
    for i in range(n):
        w, h = (375, 500) if i % 4 == 3 else (500, 375)
        coarse = rng.random((h // 16 + 2, w // 16 + 2, 3)) * 255
        img = Image.fromarray(coarse.astype(np.uint8)).resize((w + 32, h + 32), Image.BICUBIC)
        a = np.asarray(img, dtype=np.float32)[16:16 + h, 16:16 + w]
        a += rng.normal(0, 12, a.shape)
        a = np.clip(a, 0, 255).astype(np.uint8)
        path = os.path.join(root, f"class{i % classes:03d}", f"img{i:06d}.jpg")
        Image.fromarray(a).save(path, quality=90)
    with open(stamp, "w") as f:
        f.write(want)


def run_stoke(cli, spec, workers, batch):
    cmd = [cli, "load", spec, "--workers", str(workers), "--batch-size", str(batch), "--shuffle",
           "--no-pin-memory", "--no-hash", "--json"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    try:
        js = json.loads(out.stdout)
    except ValueError:
        sys.exit(f"stoke load failed: {out.stdout} {out.stderr}")
    if not js.get("ok"):
        sys.exit(f"stoke load failed: {js.get('error')}")
    return js["samples"] / js["seconds"], js, " ".join(cmd)


def run_torch(root, workers, batch, f32):
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
    return n / (time.perf_counter() - t0)


def best(fn, repeat):
    fn()  # warm-up: page cache, imports
    return max(fn() for _ in range(repeat))


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
    ap.add_argument("--skip-f32", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    cli = os.path.join(a.build, "stoke")
    if not os.access(cli, os.X_OK):
        sys.exit(f"no stoke CLI at {cli} (build it, or pass --build)")
    root = os.path.join(a.workdir, "imagefolder")
    generate(root, a.images, a.classes, a.regen)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
             if f.endswith(".jpg")]
    res = {"images": len(sizes), "mean_file_bytes": sum(sizes) / len(sizes),
           "workers": a.workers, "batch": a.batch, "cpus": os.cpu_count()}
    spec_u8 = f"images:{root},train,size=224"
    spec_f32 = spec_u8 + ",dtype=f32,mean=%s,std=%s" % (":".join(map(str, MEAN)),
                                                        ":".join(map(str, STD)))
    res["stoke_cmd"] = run_stoke(cli, spec_u8, a.workers, a.batch)[2]
    res["stoke_u8"] = best(lambda: run_stoke(cli, spec_u8, a.workers, a.batch)[0], a.repeat)
    res["stoke_u8_1worker"] = best(lambda: run_stoke(cli, spec_u8, 1, a.batch)[0], a.repeat)
    res["torch_u8"] = best(lambda: run_torch(root, a.workers, a.batch, False), a.repeat)
    res["ratio_u8"] = res["stoke_u8"] / res["torch_u8"]
    if not a.skip_f32:
        res["stoke_f32"] = best(lambda: run_stoke(cli, spec_f32, a.workers, a.batch)[0], a.repeat)
        res["torch_f32"] = best(lambda: run_torch(root, a.workers, a.batch, True), a.repeat)
        res["ratio_f32"] = res["stoke_f32"] / res["torch_f32"]
    print(f"{res['images']} JPEGs, mean {res['mean_file_bytes'] / 1024:.0f} KiB, "
          f"{a.workers} workers, batch {a.batch}, {res['cpus']} CPUs")
    print(f"  {'configuration':<44} {'images/s':>10}")
    print(f"  {'stoke images: train u8':<44} {res['stoke_u8']:>10.0f}")
    print(f"  {'torchvision ImageFolder+DataLoader u8':<44} {res['torch_u8']:>10.0f}")
    print(f"  {'ratio (target >= 3x)':<44} {res['ratio_u8']:>9.2f}x")
    print(f"  {'stoke, 1 worker = per core (target >= 400)':<44} "
          f"{res['stoke_u8_1worker']:>10.0f}")
    if not a.skip_f32:
        print(f"  {'stoke images: train f32 normalized':<44} {res['stoke_f32']:>10.0f}")
        print(f"  {'torchvision ToTensor+Normalize':<44} {res['torch_f32']:>10.0f}")
        print(f"  {'ratio f32':<44} {res['ratio_f32']:>9.2f}x")
    out = a.out or os.path.join(a.workdir, "bench_images.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"figures in {out}")


if __name__ == "__main__":
    main()
