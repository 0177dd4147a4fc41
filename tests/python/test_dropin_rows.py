"""The drop-in's row-streaming fetch: for samples of 64 KiB or more with fixed shapes under
default_collate, each sample's tensors are copied into their rows of the batch in the block as
the sample comes (a worker holds one sample, not the batch twice).  The batches equal torch's
(structure: dict, namedtuple, list, numbers and strings beside the tensors; values) at 0 and 2
workers, and a sample of another shape in a later batch raises torch's error."""
import collections

import stoke_testlib as T

np, torch = T.need("numpy", "torch")
import stoke  # noqa: E402

Meta = collections.namedtuple("Meta", "label name")


class Images:
    """3x96x96 float32 images (110 KiB), a small tensor, a namedtuple of an int and a str, and
    a float; sample `bad` (if any) has a 3x96x95 image, sample `sparse` a sparse one."""

    def __init__(self, n=40, bad=None, sparse=None):
        self.n, self.bad, self.sparse = n, bad, sparse

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        w = 95 if i == self.bad else 96
        img = torch.arange(3 * 96 * w, dtype=torch.float32).reshape(3, 96, w) * 0.5 + i
        if i == self.sparse:
            img = img.to_sparse()
        return {"img": img, "meta": Meta(i % 5, "s%d" % i),
                "extra": [torch.tensor([i, -i, 2 * i, 7], dtype=torch.int16), i * 0.5]}


def same(a, b, what):
    if isinstance(a, torch.Tensor):
        T.check(isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b), "%s: %r vs torch's %r" % (what, b, a))
    elif isinstance(a, dict):
        T.check(type(b) is type(a) and list(b) == list(a), "%s: keys %r" % (what, b))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (what, k))
    elif isinstance(a, (list, tuple)):
        T.check(type(b) is type(a) and len(b) == len(a), "%s: %r vs %r" % (what, b, a))
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (what, k))
    else:
        T.check(a == b, "%s: %r vs torch's %r" % (what, b, a))


ref = list(torch.utils.data.DataLoader(Images(), batch_size=6))
workers_list = (0,) if T.os.environ.get("STOKE_PY_TSAN") else (0, 2)
for workers in workers_list:
    loader = stoke.DataLoader(Images(), batch_size=6, num_workers=workers)
    T.check(loader._writer.rows, "workers=%d: the row-streaming fetch is not on" % workers)
    got = [b for b in loader]
    T.check(len(got) == len(ref), "workers=%d: %d batches, torch %d" % (workers, len(got),
                                                                     len(ref)))
    for k, (r, g) in enumerate(zip(ref, got)):
        same(r, g, "workers=%d batch %d" % (workers, k))
    del got, loader

try:
    list(torch.utils.data.DataLoader(Images(bad=9), batch_size=6))
    T.check(False, "torch stacked images of two shapes")
except RuntimeError as e:
    want = str(e)
for workers in workers_list:
    try:
        list(stoke.DataLoader(Images(bad=9), batch_size=6, num_workers=workers))
        T.check(False, "workers=%d: images of two shapes stacked" % workers)
    except RuntimeError as e:
        notes = " ".join(getattr(e, "__notes__", []))
        T.check(str(e) == want and "batch 1" in notes,
                "workers=%d: %s [%s] (torch: %s)" % (workers, e, notes, want))

# A later sample's tensor of another layout (or device) is not copied into its row: the column
# is stacked as torch stacks it, which raises torch's own error (its kernel's name differs:
# torch at 0 workers stacks without out=).
try:
    list(torch.utils.data.DataLoader(Images(sparse=9), batch_size=6))
    T.check(False, "torch stacked a sparse image with dense ones")
except Exception as e:
    want = (type(e), str(e)[:len("Could not run 'aten::")])
for workers in workers_list:
    try:
        list(stoke.DataLoader(Images(sparse=9), batch_size=6, num_workers=workers))
        T.check(False, "workers=%d: a sparse image was copied into a dense batch" % workers)
    except Exception as e:
        got = (type(e), str(e)[:len("Could not run 'aten::")])
        T.check(got == want, "workers=%d: %r (torch: %r)" % (workers, got, want))
print("ok")
