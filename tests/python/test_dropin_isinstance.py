"""stoke.DataLoader is a torch.utils.data.DataLoader (issue 27): isinstance() is True, as the
frameworks that decide by it need.  Lightning, under DDP, rebuilds a DataLoader with its
DistributedSampler swapped in (type(loader)(**the arguments read back from the loader's
attributes, sampler=..., shuffle=False, batch_sampler=None)); a stoke loader it did not
recognise was passed through, and each rank loaded the whole dataset.  Here the rebuild is
done as Lightning does it, on torch's loader and on stoke's: each rank's batches, epoch by
epoch, are torch's.  Without torch, stoke.DataLoader is stoke's alone, and `import stoke`
does not import torch."""
import inspect
import os
import pickle
import subprocess
import sys

import stoke_testlib as T

np = T.need("numpy")
import dropin_lib as L  # noqa: E402
from dropin_lib import case  # noqa: E402

torch, stoke = L.torch, L.stoke
from torch.utils.data import (BatchSampler, DistributedSampler, IterableDataset,  # noqa: E402
                              RandomSampler, TensorDataset)

PROCS = not os.environ.get("STOKE_PY_TSAN")  # (TSan: no worker processes running torch)
WORKERS = (0, 2) if PROCS else (0,)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


@case
def is_a_torch_dataloader():
    data = TensorDataset(torch.arange(40.0).view(20, 2), torch.arange(20))
    _, _, npy, labels = T.make_npy(np, n=16)
    T.check(issubclass(stoke.DataLoader, L.TorchLoader) and stoke.DataLoader is stoke.DataLoader
            and "DataLoader" in dir(stoke)
            and pickle.loads(pickle.dumps(stoke.DataLoader)) is stoke.DataLoader,
            "the class: %s" % (stoke.DataLoader.__mro__,))
    for what, dl, auto in (
            ("map-style", stoke.DataLoader(data, batch_size=4, shuffle=True), True),
            ("batch_size=None", stoke.DataLoader(data, batch_size=None), False),
            ("iterable", stoke.DataLoader(Stream(), batch_size=3), True),
            ("source string", stoke.DataLoader("npy:%s,labels=%s" % (npy, labels),
                                               batch_size=4, num_workers=0), None)):
        T.check(isinstance(dl, L.TorchLoader) and type(dl).__name__ == "DataLoader",
                "%s: isinstance(loader, torch's DataLoader) is False" % what)
        if auto is not None:  # (torch's properties, on stoke's attributes)
            T.check(dl._auto_collation is auto and dl._index_sampler is (
                dl.batch_sampler if auto else dl.sampler), "%s: _auto_collation %s, "
                "_index_sampler %s" % (what, dl._auto_collation, dl._index_sampler))
        try:
            dl.batch_size = 8
            T.check(False, "%s: batch_size set after construction" % what)
        except ValueError as e:
            T.check("batch_size attribute should not be set after DataLoader is initialized"
                    in str(e), "%s: %s" % (what, e))
        n = len(list(dl))
        T.check(n == (4 if what == "iterable" else len(dl)), "%s: %d batches" % (what, n))
    if PROCS:
        dl = stoke.DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
        T.check(dl.multiprocessing_context is not None
                and dl.multiprocessing_context.get_start_method() == "fork",
                "multiprocessing_context: %r" % (dl.multiprocessing_context,))

    class Mine(stoke.DataLoader):  # a user's subclass
        pass

    dl = Mine(data, batch_size=5)
    T.check(isinstance(dl, L.TorchLoader) and [len(b[1]) for b in dl] == [5] * 4,
            "a subclass of stoke.DataLoader")


def rebuild(dl, sampler):
    """Lightning's _update_dataloader: the constructor's arguments read back from the loader's
    public attributes, the sampler replaced (shuffle=False, batch_sampler=None, as its
    _dataloader_init_kwargs_resolve_sampler for a default BatchSampler), a new type(dl)."""
    params = inspect.signature(dl.__init__).parameters
    attrs = {k: v for k, v in vars(dl).items() if not k.startswith("_")}
    kw = {n: attrs[n] for n in params if n in attrs}
    kw.update(sampler=sampler, shuffle=False, batch_sampler=None)
    missing = [p.name for p in params.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.name not in kw]
    T.check(not missing, "%s: required arguments not attributes: %s" % (type(dl), missing))
    return type(dl)(**kw)


def shuffled(dl):
    """Lightning's _is_dataloader_shuffled."""
    s = dl.batch_sampler.sampler if dl.batch_sampler is not None else dl.sampler
    return isinstance(s, RandomSampler)


@case
def lightning_ddp_rebuild():
    data = TensorDataset(torch.arange(300.0).view(100, 3), torch.arange(100))
    for nw in WORKERS:
        for shuffle in (True, False):
            what = "num_workers=%d shuffle=%s" % (nw, shuffle)
            ref, got = L.pair(data, batch_size=8, shuffle=shuffle, num_workers=nw,
                              drop_last=True)
            T.check(isinstance(got, L.TorchLoader) and shuffled(got) == shuffled(ref) == shuffle
                    and type(got.batch_sampler) is BatchSampler,
                    "%s: Lightning's view of the loader" % what)
            seen = []
            for rank in range(2):
                loaders = [rebuild(dl, DistributedSampler(data, num_replicas=2, rank=rank,
                                                          shuffle=shuffle, seed=7))
                           for dl in (ref, got)]
                T.check(type(loaders[1]) is stoke.DataLoader and loaders[1].drop_last
                        and loaders[1].num_workers == nw and len(loaders[1]) == 6,
                        "%s rank %d: rebuilt as %s" % (what, rank, loaders[1]))
                for epoch in range(2):
                    out = []
                    for dl in loaders:
                        dl.sampler.set_epoch(epoch)  # (Lightning's _set_sampler_epoch)
                        out.append([b[1].tolist() for b in dl])
                    T.check(out[0] == out[1] and len(out[1]) == 6,
                            "%s rank %d epoch %d: torch %s, stoke %s" % (what, rank, epoch,
                                                                       out[0], out[1]))
                    if epoch == 0:
                        seen += [i for b in out[1] for i in b]
                del loaders
            T.check(sorted(seen) == sorted(set(seen)) and len(seen) == 96,
                    "%s: the two ranks' samples overlap or are missing: %d" % (what, len(seen)))
            del ref, got


@case
def source_string_under_lightning():
    """A source string's loader shards itself (distributed=True): Lightning's rebuild with a
    DistributedSampler is refused with what to do instead."""
    _, _, npy, labels = T.make_npy(np, n=16)
    dl = stoke.DataLoader("npy:%s,labels=%s" % (npy, labels), batch_size=4, num_workers=0,
                          distributed=True, rank=0, world_size=2)
    try:
        rebuild(dl, DistributedSampler(list(range(16)), num_replicas=2, rank=0))
        T.check(False, "a source string rebuilt with a DistributedSampler")
    except TypeError as e:
        T.check("distributed=True" in str(e) and "use_distributed_sampler=False" in str(e),
                str(e))
    T.check(sum(len(b["label"]) for b in dl) == 8, "rank 0 of 2: not half of 16 samples")


@case
def without_torch():
    """Where torch does not import: stoke.DataLoader is stoke's own class, a source string
    loads; `import stoke` alone never imports torch."""
    _, labels, npy, lab = T.make_npy(np, n=16)
    code = "\n".join([
        "import sys",
        "import stoke",
        "assert 'torch' not in sys.modules, 'import stoke imported torch'",
        "sys.modules['torch'] = None  # (import torch: ImportError)",
        "dl = stoke.DataLoader('npy:%s,labels=%s', batch_size=4, num_workers=0)" % (npy, lab),
        "names = [c.__module__ + '.' + c.__name__ for c in type(dl).__mro__]",
        "assert not any(n.startswith('torch') for n in names), names",
        "got = [int(x) for b in dl for x in memoryview(b['label']).tolist()]",
        "print(sorted(got))"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    T.check(p.returncode == 0 and p.stdout.strip() == str(sorted(labels.tolist())),
            "without torch: rc %d, %s %s" % (p.returncode, p.stdout, p.stderr))
    # an install whose import fails otherwise (OSError: its libraries): as without torch, a
    # source string with structure="dict" and a Python dataset of NumPy values included
    fake = os.path.join(T.tmpdir(), "broken")
    os.makedirs(os.path.join(fake, "torch"))
    with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
        f.write("raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    code = "\n".join([
        "import numpy as np, stoke",
        "dl = stoke.DataLoader('npy:%s,labels=%s', batch_size=4, num_workers=0, "
        "structure='dict')" % (npy, lab),
        "got = sorted(int(x) for b in dl for x in b['label'])",
        "py = [b.tolist() for b in stoke.DataLoader([np.float32(i) for i in range(8)], "
        "batch_size=4)]",
        "assert py == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], py",
        "print(got)"])
    env = dict(os.environ, PYTHONPATH=fake + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env)
    T.check(p.returncode == 0 and p.stdout.strip() == str(sorted(labels.tolist())),
            "a torch that fails to import: rc %d, %s %s" % (p.returncode, p.stdout, p.stderr))


L.run_cases()
