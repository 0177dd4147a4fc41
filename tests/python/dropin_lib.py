"""Helpers of the drop-in tests (issue 27): stoke.DataLoader against torch.utils.data.DataLoader
on the same dataset and arguments.

A test file registers its cases with @case and ends with run_cases(): every case runs (one
failing case does not hide the others), each under a watchdog that dumps every thread's stack
and exits 1 when it hangs; the file fails when any case failed.  STOKE_DROPIN_CASES=a,b runs
only the cases named."""
import collections
import faulthandler
import os
import sys
import time
import traceback

import stoke_testlib as T

torch = T.need("torch")
import stoke  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

_CASES = []


class Indices(torch.utils.data.Dataset):
    """n samples, sample i the int i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def case(fn):
    _CASES.append(fn)
    return fn


def run_cases(timeout=120):
    failed = []
    only = os.environ.get("STOKE_DROPIN_CASES")  # name,name: only these (while debugging)
    for fn in _CASES:
        if only and fn.__name__ not in only.split(","):
            continue
        start = time.monotonic()
        faulthandler.dump_traceback_later(timeout, exit=True)
        try:
            fn()
        except Exception:
            failed.append(fn.__name__)
            print("FAIL %s:\n%s" % (fn.__name__, traceback.format_exc()), flush=True)
        else:
            print("ok   %s (%.1f s)" % (fn.__name__, time.monotonic() - start), flush=True)
        finally:
            faulthandler.cancel_dump_traceback_later()
    if failed:
        print("%d of %d cases failed: %s" % (len(failed), len(_CASES), ", ".join(failed)))
        sys.exit(1)
    print("ok")


# --- structure and values ------------------------------------------------------------------

def describe(x):
    """A one-line description of a batch's structure, for messages."""
    if isinstance(x, torch.Tensor):
        return "Tensor(%s, %s)" % (x.dtype, tuple(x.shape))
    if isinstance(x, dict):
        return "%s{%s}" % (type(x).__name__,
                           ", ".join("%r: %s" % (k, describe(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        inner = [describe(v) for v in x[:4]] + (["..."] if len(x) > 4 else [])
        return "%s[%s]" % (type(x).__name__, ", ".join(inner))
    return "%s(%r)" % (type(x).__name__, x)


def snapshot(x):
    """The batch with every tensor cloned (out of the loader's memory), same structure."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return type(x)((k, snapshot(v)) for k, v in x.items())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(snapshot(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(snapshot(v) for v in x)
    return x


def same(ref, got, path="batch"):
    """Asserts got has ref's structure (container types, namedtuple class, dict keys in order),
    leaf types, tensor dtypes, shapes and values (bitwise: NaNs equal)."""
    T.check(type(got) is type(ref), "%s: %s where torch gives %s" % (path, describe(got),
                                                                    describe(ref)))
    if isinstance(ref, torch.Tensor):
        T.check(got.dtype == ref.dtype, "%s: dtype %s, torch %s" % (path, got.dtype, ref.dtype))
        T.check(got.shape == ref.shape, "%s: shape %s, torch %s" % (path, tuple(got.shape),
                                                                   tuple(ref.shape)))
        eq = torch.equal(got, ref)
        if not eq and ref.is_floating_point():
            eq = bool(((got == ref) | (got.isnan() & ref.isnan())).all())
        T.check(eq, "%s: values differ from torch's (%d of %d elements)" % (
                    path, int((got != ref).sum()), ref.numel()))
    elif isinstance(ref, dict):
        T.check(list(got.keys()) == list(ref.keys()), "%s: keys %s, torch %s" % (
            path, list(got.keys()), list(ref.keys())))
        for k in ref:
            same(ref[k], got[k], "%s[%r]" % (path, k))
    elif isinstance(ref, (list, tuple)):
        T.check(len(got) == len(ref), "%s: %d items, torch %d" % (path, len(got), len(ref)))
        for i, (r, g) in enumerate(zip(ref, got)):
            same(r, g, "%s[%d]" % (path, i))
    else:
        T.check(got == ref, "%s: %r, torch %r" % (path, got, ref))


def same_layout(ref, got, path="batch", ragged=False):
    """Structure, leaf types, dtypes and the shapes' trailing dimensions (the batch dimension
    may differ: shuffled batches; ragged: only the number of dimensions is compared)."""
    T.check(type(got) is type(ref), "%s: %s where torch gives %s" % (path, describe(got),
                                                                    describe(ref)))
    if isinstance(ref, torch.Tensor):
        T.check(got.dtype == ref.dtype, "%s: dtype %s, torch %s" % (path, got.dtype, ref.dtype))
        T.check(got.dim() == ref.dim() and (ragged or got.shape[1:] == ref.shape[1:]),
                "%s: shape %s, torch %s" % (path, tuple(got.shape), tuple(ref.shape)))
    elif isinstance(ref, dict):
        T.check(list(got.keys()) == list(ref.keys()), "%s: keys %s, torch %s" % (
            path, list(got.keys()), list(ref.keys())))
        for k in ref:
            same_layout(ref[k], got[k], "%s[%r]" % (path, k), ragged)
    elif isinstance(ref, (list, tuple)):
        T.check(len(got) == len(ref) or not ref or isinstance(ref[0], str),
                "%s: %d items, torch %d" % (path, len(got), len(ref)))
        if ref and not isinstance(ref[0], str):
            for i, (r, g) in enumerate(zip(ref, got)):
                same_layout(r, g, "%s[%d]" % (path, i), ragged)


def leaves(x, out=None):
    out = [] if out is None else out
    if isinstance(x, dict):
        for v in x.values():
            leaves(v, out)
    elif isinstance(x, (list, tuple)) and x and not isinstance(x[0], str):
        for v in x:
            leaves(v, out)
    else:
        out.append(x)
    return out


def batch_len(b):
    """Samples in a collated batch: the first dimension of its leaves (tensors, or lists of
    str/objects), which must agree."""
    n = {len(v) for v in leaves(b)}
    T.check(len(n) == 1, "leaves of different lengths in %s" % describe(b))
    return n.pop()


def unbatch(b):
    """The samples of a collated batch as hashable keys: per leaf, the row's dtype, shape and
    bytes (tensors) or the item (lists of str/objects)."""
    ls = leaves(b)
    out = []
    for i in range(batch_len(b)):
        key = []
        for v in ls:
            if isinstance(v, torch.Tensor):
                r = v[i].contiguous()
                key.append((str(r.dtype), tuple(r.shape), r.numpy().tobytes()))
            else:
                key.append(v[i])
        out.append(tuple(key))
    return out


def epoch(loader, keep=snapshot):
    return [keep(b) for b in loader]


def check_sequential(ref, got, what):
    """Both loaders yielded their batches in the sampler's order: the same batches, in order."""
    T.check(len(got) == len(ref), "%s: %d batches, torch %d" % (what, len(got), len(ref)))
    for k, (r, g) in enumerate(zip(ref, got)):
        same(r, g, "%s: batch %d" % (what, k))


def check_multiset(ref, got, what, key=unbatch, ragged=False):
    """The same samples (as a multiset) over the epoch, the same batch sizes, and every batch
    with torch's structure, dtypes and trailing shapes (ragged: numbers of dimensions)."""
    T.check(len(got) == len(ref), "%s: %d batches, torch %d" % (what, len(got), len(ref)))
    for k, g in enumerate(got):
        same_layout(ref[0], g, "%s: batch %d" % (what, k), ragged)
    rs = sorted(batch_len(b) for b in ref)
    gs = sorted(batch_len(b) for b in got)
    T.check(rs == gs, "%s: batch sizes %s, torch %s" % (what, gs, rs))
    rc = collections.Counter(s for b in ref for s in key(b))
    gc = collections.Counter(s for b in got for s in key(b))
    T.check(rc == gc, "%s: samples differ: %d only in torch's, %d only in stoke's (of %d)" % (
        what, sum((rc - gc).values()), sum((gc - rc).values()), sum(rc.values())))


# STOKE_DROPIN_SELFTEST=1 checks the tests themselves: "stoke's" loader is then torch's (the
# cases using stoke's own keywords fail).
SELFTEST = os.environ.get("STOKE_DROPIN_SELFTEST") == "1"


def Loader(dataset, **kw):
    """stoke.DataLoader(dataset, **kw)."""
    if SELFTEST:
        return TorchLoader(dataset, **kw)
    return stoke.DataLoader(dataset, **kw)


def pair(dataset, stoke_kw=None, **kw):
    """torch's and stoke's loaders over the same dataset with the same arguments."""
    ref = TorchLoader(dataset, **kw)
    got = Loader(dataset, **kw, **(stoke_kw or {}))
    return ref, got


def check_len(ref, got, what):
    try:
        want = len(ref)
    except TypeError:
        try:
            n = len(got)
        except TypeError:
            return
        raise AssertionError("%s: len(loader) is %d, torch's raises TypeError" % (what, n))
    T.check(len(got) == want, "%s: len %d, torch %d" % (what, len(got), want))


# --- processes -----------------------------------------------------------------------------

def children(pid=None):
    """Pids of the live (or zombie) processes whose parent is pid (this process)."""
    me = str(pid or os.getpid())
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % p) as f:
                if any(line.split() == ["PPid:", me] for line in f):
                    out.append(int(p))
        except OSError:
            pass
    return out


def no_children_within(seconds, what):
    """Waits up to `seconds` for this process to have no child; fails naming them if not."""
    deadline = time.monotonic() + seconds
    while True:
        left = children()
        if not left:
            return
        if time.monotonic() > deadline:
            desc = []
            for p in left:
                try:
                    with open("/proc/%d/stat" % p) as f:
                        desc.append("%d (%s)" % (p, f.read().split(")")[-1].split()[0]))
                except OSError:
                    desc.append(str(p))
            raise AssertionError("%s: child processes left %.0f s after: %s" % (
                what, seconds, ", ".join(desc)))
        time.sleep(0.05)
