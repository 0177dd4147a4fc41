"""stoke.DataLoader against torch.utils.data.DataLoader (issue 27), differential, part 3:
torchvision datasets with PIL transforms -- FakeData with the ImageNet train transforms
(RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize) and an ImageFolder over generated
JPEGs with deterministic transforms (Resize, CenterCrop, ToTensor).

The random transforms draw from torch's global RNG: their values are compared exactly through a
wrapper that seeds torch and `random` from the sample index (any loader's RNG use), and after
torch.manual_seed where stoke draws from the RNG as torch does (the base seed of each epoch when
its iteration starts); otherwise structure, dtypes, shapes, the normalized range, the labels,
and augmentations that change from epoch to epoch."""
import os
import random
import time

import stoke_testlib as T

T.no_forked_python_under_tsan()

np = T.need("numpy")
torchvision = T.need("torchvision")
import dropin_lib as L  # noqa: E402
from dropin_lib import case, check_len, check_multiset, check_sequential, epoch, pair  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402

torch = L.torch
from torch.utils.data import Dataset, get_worker_info  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TRAIN = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


def fake(n=24):
    return datasets.FakeData(size=n, image_size=(3, 64, 48), num_classes=10, transform=TRAIN)


class SeededByIndex(Dataset):
    """The random transforms' draws depend on the sample index only."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        torch.manual_seed(1000 + i)
        random.seed(i)
        return self.ds[i]


@case
def fakedata_train_transforms_values():
    ds = SeededByIndex(fake())
    for workers in (0, 2):
        what = "FakeData train transforms (seeded by index) workers=%d" % workers
        ref, got = pair(ds, batch_size=8, num_workers=workers)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        check_sequential(r, s, what)
        T.check(s[0][0].shape == (8, 3, 224, 224), "%s: shape %s" % (what, s[0][0].shape))
    ref, got = pair(ds, batch_size=8, shuffle=True, num_workers=2)
    check_multiset(epoch(ref), epoch(got), "FakeData train transforms shuffled workers=2")


def check_normalized(batches, what):
    lo = torch.tensor([(0 - m) / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1)
    hi = torch.tensor([(1 - m) / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1)
    for k, (x, _) in enumerate(batches):
        T.check(bool(((x >= lo - 1e-5) & (x <= hi + 1e-5)).all()),
                "%s: batch %d outside the normalized range" % (what, k))


class SlowFirst(Dataset):
    """Sample 0 takes 0.5 s in a worker: the other worker is free first (torch still deals
    batch 2 to worker 0, round-robin, whatever the timing)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        if i == 0 and get_worker_info() is not None:
            time.sleep(0.5)
        return self.ds[i]


@case
def fakedata_train_transforms_global_seed():
    """torch.manual_seed(s) and the random transforms left to the loaders' RNG: torch draws
    each epoch's base seed from the global RNG when its iteration starts (0 workers: the
    samples then draw from it; workers: seeded base_seed + id, batch k in worker k %
    num_workers), so a loader drawing as torch's gives torch's augmentations, epoch after
    epoch -- with the seed set before the loader is made, and after it (before the loop, as
    training scripts do)."""
    ds = SlowFirst(fake())
    bad = []
    for workers in (0, 2):
        for when in ("before", "after"):
            what = "manual_seed %s the loader is made, workers=%d" % (when, workers)
            out = []
            for make in (L.TorchLoader, L.Loader):
                if when == "before":
                    torch.manual_seed(123)
                loader = make(ds, batch_size=8, num_workers=workers)
                if when == "after":
                    torch.manual_seed(123)
                out.append([epoch(loader) for _ in range(2)])
                del loader
            for e in range(2):
                try:
                    check_sequential(out[0][e], out[1][e], "%s, epoch %d" % (what, e))
                except AssertionError as x:
                    bad.append(str(x))
    T.check(not bad, "augmentations differ from torch's after torch.manual_seed:\n  " +
            "\n  ".join(bad))


@case
def fakedata_train_transforms_random():
    """The transforms left to the loaders' RNG: torch's structure, dtypes, shapes, labels and
    range; each epoch draws new augmentations (as torch's loader does)."""
    ds = fake()
    labels = torch.tensor([int(ds[i][1]) for i in range(len(ds))])
    for workers in (0, 2):
        what = "FakeData train transforms workers=%d" % workers
        ref = L.TorchLoader(ds, batch_size=8, num_workers=workers)
        r = epoch(ref)
        torch.manual_seed(123)
        got = L.Loader(ds, batch_size=8, num_workers=workers)
        check_len(ref, got, what)
        s1, s2 = epoch(got), epoch(got)
        for s in (s1, s2):
            T.check(len(s) == len(r) == 3, "%s: %d batches, torch %d" % (what, len(s), len(r)))
            for k, (a, b) in enumerate(zip(r, s)):
                L.same_layout(a, b, "%s: batch %d" % (what, k))
                L.same(a[1], b[1], "%s: batch %d labels" % (what, k))
            T.check(torch.equal(torch.cat([b[1] for b in s]), labels), "%s: labels" % what)
            check_normalized(s, what)
        T.check(any(not torch.equal(a[0], b[0]) for a, b in zip(s1, s2)),
                "%s: two epochs drew the same augmentations" % what)


def make_folder():
    """3 classes x 5 JPEGs of different sizes (and one grayscale), made with PIL."""
    root = T.tmpdir()
    rng = np.random.default_rng(27)
    for c, cls in enumerate(("cat", "dog", "eel")):
        os.makedirs(os.path.join(root, cls))
        for k in range(5):
            h, w = 40 + 7 * k + c, 50 + 5 * k
            px = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            px[: h // 2] //= 2  # some structure for the resampling
            img = Image.fromarray(px)
            if (c, k) == (1, 2):
                img = img.convert("L")
            img.save(os.path.join(root, cls, "img%02d.jpg" % k), quality=90)
    return root


@case
def imagefolder_jpegs():
    tf = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32),
                             transforms.ToTensor()])
    ds = datasets.ImageFolder(make_folder(), transform=tf)
    T.check(len(ds) == 15, "ImageFolder found %d images" % len(ds))
    for workers in (0, 1, 2):
        what = "ImageFolder workers=%d" % workers
        ref, got = pair(ds, batch_size=4, num_workers=workers)
        check_len(ref, got, what)
        r, s = epoch(ref), epoch(got)
        check_sequential(r, s, what)
        T.check(s[0][0].shape == (4, 3, 32, 32) and s[-1][0].shape == (3, 3, 32, 32),
                "%s: shapes %s %s" % (what, s[0][0].shape, s[-1][0].shape))
    ref, got = pair(ds, batch_size=4, shuffle=True, num_workers=2)
    check_multiset(epoch(ref), epoch(got), "ImageFolder shuffled workers=2")


L.run_cases()
