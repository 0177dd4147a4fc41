"""stoke.DataLoader over a Python dataset: torch.utils.data.DataLoader's behaviour, stoke's memory.

The C loader runs a *batch writer* (python/pywriter.c): its "sample" i is batch i of the epoch,
one block of `blob_bytes` in the loader's pinned batch memory.  `_Writer.fill` (in a forked
worker process, a worker thread, or the caller's thread with num_workers=0) fetches the batch's
samples, collates them straight into the block, and pickles the batch's structure after the
data with every tensor and array replaced by a reference to its bytes in the block.  The
consumer's `decode` unpickles that structure with each reference turned into a torch.Tensor
(a NumPy array where it was one, or where torch is missing) viewing the block: no copy after
the worker's.  A batch made in the consumer's process (no worker processes) is not pickled:
its structure, references in place of tensors, stays in `_Writer.live` under a token that the
block's header holds (MAGIC_LIVE).  Without workers, a map dataset's block size is measured
on batch 0 made at construction, which the first fill delivers (`measure_here`); nothing runs
an IterableDataset before iteration starts (`measure`: its blocks are not measured).

Block layout: a 64-byte header (magic, pickle offset, pickle length; MAGIC_FAST, skeleton
offset, skeleton length, table offset, table entries; MAGIC_LIVE, token, the data's end; or
MAGIC_SPILL: the batch outgrew the block and was made in memory of its own, `_Writer.spill`),
the leaves' bytes from offset 64 each aligned to 64, then the pickle (or the table and the
skeleton).

A batch of containers (dict, list, tuple, namedtuple) and tensors or arrays only goes as
MAGIC_FAST (_Block.finish_fast): the skeleton is the structure pickled with each leaf a slot
(kind, dtype, dimensions, its place in the table), the same bytes for every batch of the same
structure; the table holds each leaf's offset and shape as int64s.  The consumer compiles a
skeleton once into a function that makes the batch's tensors from the table (_Builders), and
finds it again by the skeleton's bytes.

The plan (`_Plan`) is a shared anonymous mapping made before the workers fork: the epoch's
batches (dataset indices and offsets, written by the consumer's process in the loader's
set_epoch hook, before any worker fetches a sample of that epoch), the epoch's base seed, and
one mailbox per worker where a failing fill leaves its pickled exception and traceback.
"""
import collections.abc as _abc
import copyreg
import gc
import hashlib
import io
import itertools
import math
import mmap
import numbers
import operator
import os
import pickle
import random
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
import warnings
import weakref

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is a dependency of the extension's users
    np = None
try:
    import torch
except Exception:  # noqa: BLE001 - not installed, or an install that fails to import (an
    torch = None   # OSError from its libraries): NumPy arrays, as without torch

from . import _stoke

_ROW_BYTES = 64 << 10  # a sample's bytes from which the row-streaming fetch pays (_Writer.row)
MAGIC = 0x3142544B4F5453      # "STOKTB1": a batch
MAGIC_END = 0x3142444E4F5453   # "STONDB1": this worker's iterator is exhausted; its id follows
MAGIC_LIVE = 0x31424C4F4F5453  # "STOOLB1": a batch whose structure this process keeps (token, end)
MAGIC_FAST = 0x3142534B4F5453  # "STOKSB1": a batch as a skeleton and a table of its leaves
MAGIC_SPILL = 0x3142494C505354  # "TSPLIB1": the batch outgrew its block: made in memory of its
#                                 own (_Writer.spill); pid, bytes, seq, worker follow


_HEAD = struct.Struct("<QQQQQ").unpack_from  # a block's header: magic and 4 words


def _close_fds(*fds):
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _close_spills(spills, socks):
    """A writer's end: the memfds received and not mapped (batches never decoded), its
    sockets (those in flight go with them)."""
    for v in spills.values():
        if type(v) is int:
            os.close(v)
    spills.clear()
    for pair in socks:
        for sock in pair:
            sock.close()


class _Deleted:
    """In a dataset's patch (_Writer.ship_changes): the attribute was deleted."""


class _End:
    """decode()'s answer for an END block: the worker whose iterator is exhausted."""
    __slots__ = ("worker",)

    def __init__(self, worker):
        self.worker = worker


class _Skipped:
    """decode()'s answer for a batch that on_error skipped (None is a batch: a collate_fn's)."""
HDR = 64
# A worker's mailbox: the failures of batches the consumer has not reached yet, one entry each
# (an epoch goes on past a map-style dataset's error: every batch in flight may fail, and a
# fixed 4 lost the later ones' exceptions: LoaderErrors).  As many entries as a worker may
# have batches in flight (_Plan), used from the first: its header page counts the entries ever
# used, and only those are read (a read of an untouched page of the shared mapping allocates it)
MAIL_ENTRY = 1 << 14
MAIL_ENTRIES = 16  # at least
_NP_KINDS = "biufc"  # numeric and bool arrays go into the block; others are pickled


_END = object()  # an iterator's end (next(it, _END))
# An IterableDataset in worker processes: the C loader's batches per epoch (a MAP dataset whose
# batch i is the next batch of whichever worker fills it); an epoch with more is cut, warning.
_ITER_BATCHES = 1 << 48  # (9 years at a million batches a second: no cap in practice)
# ... with in_order=False, whose C loader keeps one bit per batch of an epoch (2 MiB)
_ITER_BATCHES_UNORDERED = 1 << 24
_INTERRUPTED_END = ": not a bad sample, the epoch ends"  # (_Writer.interrupted's message)
_INIT_FAILED = "worker_init of dataset"  # (the C loader's message for a failed worker_init)
_ITER_LOST = ("worker process %d replaced one that died in this epoch: the IterableDataset's "
              "iterator of that worker died with it, and a new one would repeat its samples")


class _KeptError:
    """In a mailbox: the exception is in the writer's kept_errors under this token."""

    def __init__(self, token):
        self.token = token


class _Rebuild:
    """In a mailbox: a worker process's exception that does not pickle as itself (an attribute
    holding a lock, an __init__ with other arguments, a long message), made again in the
    consumer's process as torch's ExceptionWrapper.reraise() makes every worker's: its type
    called with torch's message ("Caught ValueError in DataLoader worker process 0.\nOriginal
    Traceback ..."), a RuntimeError with that message where the type cannot be made so."""

    def __init__(self, type_, msg):
        self.type, self.msg = type_, msg

    def make(self):
        t, msg = self.type, self.msg
        try:
            if t is KeyError and torch is not None:  # (torch's KeyErrorMessage: its repr()
                from torch._utils import KeyErrorMessage  # is the text itself)
                msg = KeyErrorMessage(msg)
            elif getattr(t, "message", None):
                return t(message=msg)
            return t(msg)
        except Exception:  # noqa: BLE001 - torch's fallback (it catches TypeError)
            return RuntimeError(msg)


class _Abandoned(Exception):
    """Raised between two samples of a batch nobody wants any more (its run was abandoned: a
    new iteration, set_epoch, a restored state, an error that ended the epoch, the loader's
    end): the C loader discards the batch (stoke_dataset_abandoned)."""


class _Overflow(Exception):
    def __init__(self, need):
        super().__init__(need)
        self.need = need
        self.out = _NOTHING  # the collate_fn's output that did not fit (made once: spill)


_NOTHING = object()
_SPILL = struct.Struct("<QqQQq")  # MAGIC_SPILL, pid, bytes, seq, worker
_SPILL_MSG = struct.Struct("<qQ")  # a spill's memfd's message: pid, seq


def _align(n):
    return (n + 63) & ~63


def _finish_keeping(block, out):
    """block.finish(out) of an output made apart from the block (a collate_fn's); an _Overflow
    carries out, so that spill() does not make it again."""
    try:
        return block.finish(out, True)
    except _Overflow as o:
        o.out = out
        raise


def _map_spill(fd, nbytes):
    """A worker process's spilled batch (its memfd, received), mapped copy-on-write."""
    try:
        return memoryview(mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE,
                                    prot=mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        os.close(fd)


_ITEMSIZE = {}


def _itemsize(dtype):
    n = _ITEMSIZE.get(dtype)
    if n is None:
        n = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return n


class _NotLive(Exception):
    """A batch's structure holds an object that _Block.shape does not rebuild: it is pickled."""


class _Ref:
    """A tensor (kind "t") or NumPy array ("n") of a kept structure: its place in the block."""
    __slots__ = ("kind", "off", "nbytes", "dtype", "shape")

    def __init__(self, kind, off, nbytes, dtype, shape):
        self.kind, self.off, self.nbytes, self.dtype, self.shape = kind, off, nbytes, dtype, shape


class _Opaque:
    """A kept structure that is an object kept as it is (_Block.finish: it does not pickle; a
    tensor on another device than the CPU: _Block.shape)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


class _Local:
    """A kept structure pickled by _LocalPickler: its bytes and the objects it refers to."""
    __slots__ = ("data", "objs")

    def __init__(self, data, objs):
        self.data, self.objs = data, objs


class _Named:
    """A namedtuple of a kept structure: its type and its fields' structures."""
    __slots__ = ("type", "items")

    def __init__(self, type_, items):
        self.type, self.items = type_, items


_PLAIN = (str, bytes, int, float, bool, type(None))
_PLAIN_PICKLED = frozenset(_PLAIN + (list, dict, tuple, set, frozenset, complex))
_FAST_MAX = 32          # skeletons a writer sends as MAGIC_FAST; new ones after that are pickled
_SKELETON_MAX = 4096    # bytes: a larger skeleton is pickled (its leaves are many, or its keys)
_SKELETON_DEPTH = 32    # containers nested deeper are pickled


class _Slot:
    """A leaf of a MAGIC_FAST skeleton: kind "t" (tensor) or "n" (array), the dtype's name
    (torch's without "torch.", NumPy's dtype.str), dimensions, its first entry in the table."""
    __slots__ = ("kind", "dtype", "ndim", "at")

    def __init__(self, kind, dtype, ndim, at):
        self.kind, self.dtype, self.ndim, self.at = kind, dtype, ndim, at


class _SkeletonPickler(pickle.Pickler):
    def __init__(self, f):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(self, obj):
        if type(obj) is _Slot:
            return (obj.kind, obj.dtype, obj.ndim, obj.at)
        return None


class _SkeletonUnpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, dtype, ndim, at = pid
        if kind not in ("t", "n") or type(ndim) is not int or type(at) is not int or ndim < 0:
            raise pickle.UnpicklingError("stoke: a bad leaf in a batch's skeleton: %r" % (pid,))
        return _Slot(kind, dtype, ndim, at)


class _Builders:
    """The consumer's compiled skeletons, by their bytes: each a function (block view, table
    offset) -> the batch, each of its tensors torch.frombuffer of its own bytes of the block
    (a storage of its own: _leaf_tensor), its arrays np.frombuffer.
    Compiled once per structure: the generated code names only its own locals, the table's
    entries and constants held in lists (dict keys, namedtuple types, dtypes), never text
    taken from the block."""
    MAX = 2 * _FAST_MAX  # per worker at most _FAST_MAX: more are from changing structures

    def __init__(self):
        self.cache = {}

    def get(self, view, a, n):
        key = bytes(view[a:a + n])
        fn = self.cache.get(key)
        if fn is None:
            if len(self.cache) >= self.MAX:
                self.cache.clear()
            fn = self.cache[key] = self.compile(key)
        return fn

    @staticmethod
    def compile(key):
        tmpl = _SkeletonUnpickler(io.BytesIO(key)).load()
        consts = []   # dict keys, namedtuple types, dtypes
        entries = 0

        def const(v):
            consts.append(v)
            return "C[%d]" % (len(consts) - 1)

        def leaf(x):
            nonlocal entries
            j = x.at
            dims = ["T[%d]" % (j + 1 + k) for k in range(x.ndim)]
            entries = max(entries, j + 1 + x.ndim)
            size = "(" + "".join(d + ", " for d in dims) + ")"
            if x.kind == "t":
                if torch is None:
                    raise RuntimeError("stoke: a batch holds tensors and torch is not importable")
                dt = getattr(torch, x.dtype, None)
                if not isinstance(dt, torch.dtype):
                    raise pickle.UnpicklingError("stoke: a bad dtype in a batch: %r" % x.dtype)
                d = const(dt)
                at = "T[%d] * %d" % (j, _itemsize(dt))  # (the table counts elements)
                if not dims:
                    return "FB(v, dtype=%s, count=1, offset=%s).view(())" % (d, at)
                return "(FB(v, dtype=%s, count=n, offset=%s).view(%s) if (n := %s) else " \
                       "EMPTY(%s, dtype=%s))" % (d, at, size, "*".join(dims), size, d)
            count = "*".join(dims) or "1"
            return "NPFB(v, dtype=%s, count=%s, offset=T[%d]).reshape(%s)" % (
                const(np.dtype(x.dtype)), count, j, size)

        def gen(x):
            t = type(x)
            if t is _Slot:
                return leaf(x)
            if t is list:
                return "[" + "".join(gen(e) + ", " for e in x) + "]"
            if t is tuple:
                return "(" + "".join(gen(e) + ", " for e in x) + ")"
            if t is dict:
                return "{" + "".join("%s: %s, " % (const(k), gen(e)) for k, e in x.items()) + "}"
            if _is_namedtuple(x):
                return "%s(%s)" % (const(t), "".join(gen(e) + ", " for e in x))
            raise pickle.UnpicklingError("stoke: a batch's skeleton holds a %s" % t.__name__)

        expr = gen(tmpl)
        lines = ["def build(v, toff):", "    T = UNPACK(v, toff)", "    return " + expr]
        ns = {"C": consts, "UNPACK": struct.Struct("<%dq" % entries).unpack_from,
              "NPFB": np.frombuffer if np is not None else None,
              "FB": torch.frombuffer if torch is not None else None,
              "EMPTY": torch.empty if torch is not None else None}
        exec(compile("\n".join(lines), "<stoke batch builder>", "exec"), ns)
        return ns["build"]


# ---- the block: leaves written into it, the structure pickled after them ---------------------

class _Block:
    """A worker's writer into one batch block (a writable memoryview of the pinned slot)."""

    def __init__(self, view, live=None, fast=None):
        self.view = view
        self.cap = len(view)
        self.off = HDR
        self.pickled = 0
        self.live = live  # the writer's kept structures: the batch is decoded in this process
        self.u8 = torch.frombuffer(view, dtype=torch.uint8) if torch is not None else None
        self.base = self.u8.data_ptr() if torch is not None else None
        self.fast = fast  # the writer's skeletons seen (_Block.finish_fast); None: not used

    def take(self, nbytes):
        off = self.off
        end = off + nbytes
        if end > self.cap:
            raise _Overflow(end)
        self.off = _align(end)
        return off

    def tensor(self, dtype, shape):
        """A new tensor in the block (torch)."""
        n = 1
        for d in shape:
            n *= d
        itemsize = _itemsize(dtype)
        off = self.take(n * itemsize)
        return self.u8[off:off + n * itemsize].view(dtype).view(tuple(shape))

    def array(self, dtype, shape):
        """A new NumPy array in the block, and its offset."""
        dtype = np.dtype(dtype)
        n = 1
        for d in shape:
            n *= d
        off = self.take(n * dtype.itemsize)
        return np.frombuffer(self.view, dtype=dtype, count=n, offset=off).reshape(shape), off

    def ref_tensor(self, t):
        """A persistent id of tensor t: its place in the block, copied there if it is not."""
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
            return None
        if t.requires_grad:
            t = t.detach()
        p = t.data_ptr()
        nbytes = t.numel() * t.element_size()
        if (t.is_contiguous() and self.base <= p and p + nbytes <= self.base + self.cap
                and (t.numel() == 0 or p >= self.base + HDR)):
            off = p - self.base
        else:
            dst = self.tensor(t.dtype, t.shape)
            dst.copy_(t)
            off = dst.data_ptr() - self.base if t.numel() else 0
        return ("t", off, str(t.dtype)[6:], tuple(t.shape))

    def ref_array(self, a):
        if a.dtype.kind not in _NP_KINDS or a.dtype.hasobject:
            return None
        dst, off = self.array(a.dtype, a.shape)
        dst[...] = a
        return ("n", off, a.dtype.str, a.shape)

    def finish(self, obj, apart=False, samples=None):
        """Pickles obj (its tensors and arrays as references) after the data; the header.
        With `live` (the batch is made and decoded in the same process: no worker processes)
        the structure is kept in that dict instead, under a token the header holds, unless it
        holds an object that shape() does not rebuild.  A structure of containers and
        tensors (arrays) only goes as MAGIC_FAST, in both cases (finish_fast).  apart: obj
        views nothing of the block (a collate_fn's output, not the block's collator's), so
        that where it does not pickle it may be kept as it is (_Opaque); samples: those the
        collator made obj of (_LocalPickler keeps their objects that do not pickle)."""
        if self.fast is not None:
            off = self.off
            try:
                return self.finish_fast(obj)
            except _NotLive:
                self.off = off  # (what was copied is copied again below)
        if self.live is not None:
            off = self.off
            try:
                shape = self.shape(obj)
            except _NotLive:
                self.off = off  # (the pickle copies what it needs again)
            else:
                return self.keep_live(shape)
        f = io.BytesIO()
        start = self.off
        try:
            _BlockPickler(f, self).dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError):
            if self.live is None:
                raise
            self.off = start
            if apart:
                # decoded in this process: an object that does not pickle (a lock, a local
                # class) is kept as it is, as torch's num_workers=0 yields it (its tensors
                # where the collate_fn made them)
                return self.keep_live(_Opaque(obj))
            # the block's collation of samples whose classes pickle cannot name (defined in
            # a function): decoded in this process, they go by reference (the block's
            # tensors, kept as they are, would see the next batches written over them)
            f = io.BytesIO()
            p = _LocalPickler(f, self, samples)
            p.dump(obj)
            return self.keep_live(_Local(f.getvalue(), p.objs))
        data = f.getbuffer()
        off = self.off
        if off + len(data) > self.cap:
            raise _Overflow(off + len(data))
        self.view[off:off + len(data)] = data
        struct.pack_into("<QQQ", self.view, 0, MAGIC, off, len(data))
        self.pickled = len(data)
        return off + len(data)

    def keep_live(self, shape):
        """shape kept in self.live under a token the header holds (MAGIC_LIVE)."""
        token = next(_tokens)
        self.live[token] = shape
        if len(self.live) > _LIVE_MAX:  # batches made but never decoded (an epoch left
            _forget_oldest(self.live)   # mid-way): their structures go
        struct.pack_into("<QQQ", self.view, 0, MAGIC_LIVE, token, self.off)
        return self.off

    def finish_fast(self, obj):
        """finish() as MAGIC_FAST: the table of the leaves' offsets (in elements for a tensor,
        in bytes for an array) and shapes, then the skeleton; _NotLive for a structure with
        anything else than containers and tensors (arrays), or once this writer has seen
        _FAST_MAX skeletons (the consumer compiles each one: a structure that changes from
        batch to batch, its dict keys say, is pickled instead)."""
        ints = []
        tmpl = self.skeleton(obj, ints)
        f = io.BytesIO()
        try:
            _SkeletonPickler(f).dump(tmpl)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # a local namedtuple
            raise _NotLive from e
        skel = f.getbuffer()
        seen = self.fast
        if len(seen) >= _FAST_MAX:
            key = bytes(skel)
            if key not in seen:
                raise _NotLive
        elif len(skel) <= _SKELETON_MAX:
            seen.add(bytes(skel))
        else:
            raise _NotLive
        toff = self.off
        nt = 8 * len(ints)
        end = toff + nt + len(skel)
        if end > self.cap:
            raise _Overflow(end)
        struct.pack_into("<%dq" % len(ints), self.view, toff, *ints)
        self.view[toff + nt:end] = skel
        struct.pack_into("<QQQQQ", self.view, 0, MAGIC_FAST, toff + nt, len(skel), toff,
                         len(ints))
        self.pickled = nt + len(skel)
        return end

    def skeleton(self, x, ints, depth=0):
        """x's structure with each tensor (array) a _Slot, its offset and shape appended to
        ints; _NotLive where finish_fast does not apply (also containers nested deeper than
        _SKELETON_DEPTH: the consumer's builder is one expression)."""
        t = type(x)
        if torch is not None and t is torch.Tensor:
            r = self.ref_tensor(x)
            if r is None:
                raise _NotLive
            isz = x.element_size()
            if r[1] % isz:  # (a view at an odd place of the block: the pickle takes it)
                raise _NotLive
            slot = _Slot("t", r[2], len(r[3]), len(ints))
            ints.append(r[1] // isz)
            ints.extend(r[3])
            return slot
        if np is not None and t is np.ndarray:
            r = self.ref_array(x)
            if r is None:
                raise _NotLive
            slot = _Slot("n", r[2], len(r[3]), len(ints))
            ints.append(r[1])
            ints.extend(r[3])
            return slot
        depth += 1
        if depth > _SKELETON_DEPTH:
            raise _NotLive
        if t is list:
            return [self.skeleton(v, ints, depth) for v in x]
        if t is dict:
            return {k: self.skeleton(v, ints, depth) for k, v in x.items()}
        if t is tuple:
            return tuple(self.skeleton(v, ints, depth) for v in x)
        if _is_namedtuple(x):
            return t(*(self.skeleton(v, ints, depth) for v in x))
        raise _NotLive

    def shape(self, x):
        """obj's structure with each tensor and array a _Ref to its bytes in the block (copied
        there if they are not), for _load_live; _NotLive for what pickling would treat
        otherwise than this rebuilds (a subclass, a custom batch type, an object array)."""
        t = type(x)
        if t in _PLAIN:
            return x
        if torch is not None and t is torch.Tensor:
            if x.device.type != "cpu" and x.layout == torch.strided:
                return _Opaque(x)  # on its device, as torch yields it (not copied to the CPU)
            r = self.ref_tensor(x)
            if r is None:
                raise _NotLive
            n = x.numel() * x.element_size()
            return _Ref("t", r[1], n, x.dtype, r[3])
        if np is not None and t is np.ndarray:
            r = self.ref_array(x)
            if r is None:
                raise _NotLive
            return _Ref("n", r[1], x.nbytes, x.dtype, r[3])
        if t is list:
            return [self.shape(v) for v in x]
        if t is dict:
            return {k: self.shape(v) for k, v in x.items()}
        if t is tuple:
            return tuple(self.shape(v) for v in x)
        if _is_namedtuple(x):  # made when loaded, from the loaded fields (as unpickling)
            return _Named(t, [self.shape(v) for v in x])
        raise _NotLive


_tokens = itertools.count(1)
_LIVE_MAX = 1024  # kept structures; more than the batches any loader has made and not decoded


def _forget_oldest(live):
    try:
        for k in list(itertools.islice(live, len(live) - _LIVE_MAX // 2)):
            live.pop(k, None)
    except RuntimeError:  # changed by another thread meanwhile: next time
        pass


def _leaf_tensor(view, dtype, off, nbytes, shape):
    """A tensor of a batch: torch.frombuffer of its own bytes of the block, a storage of its
    own (as torch's batches: torch.save, pickle or a queue of one label carries the label,
    not the block), which holds the view, which holds the batch."""
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(view, dtype=dtype, count=nbytes // _itemsize(dtype),
                            offset=off).view(shape)


def _load_live(x, view):
    """A kept structure (_Block.shape) with each _Ref a tensor (array) viewing the block."""
    t = type(x)
    if t is _Ref:
        if x.kind == "t":
            return _leaf_tensor(view, x.dtype, x.off, x.nbytes, x.shape)
        return np.frombuffer(view, dtype=x.dtype, count=x.nbytes // x.dtype.itemsize,
                             offset=x.off).reshape(x.shape)
    if t in _PLAIN:
        return x
    if t is _Opaque:
        return x.obj
    if t is _Local:
        return _BlockUnpickler(io.BytesIO(x.data), view, x.objs).load()
    if t is list:
        return [_load_live(v, view) for v in x]
    if t is dict:
        return {k: _load_live(v, view) for k, v in x.items()}
    if t is tuple:
        return tuple(_load_live(v, view) for v in x)
    return x.type(*(_load_live(v, view) for v in x.items))  # _Named


class _BlockPickler(pickle.Pickler):
    def __init__(self, f, block):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.block = block

    def persistent_id(self, obj):
        if torch is not None and isinstance(obj, torch.Tensor):
            if type(obj) is torch.Tensor and obj.layout == torch.sparse_coo and (
                    obj.device.type == "cpu"):
                # by its indices and values (each a tensor of the block) and whether it is
                # coalesced: torch's pickle of a sparse tensor leaves that flag out, and one
                # loaded uncoalesced has no indices() (torch's num_workers=0 keeps it)
                t = obj.detach()
                return ("s", t._indices(), t._values(), tuple(t.shape), t.is_coalesced())
            pid = self.block.ref_tensor(obj)
            cls = type(obj)
            if pid is None or cls is torch.Tensor:
                return pid  # (detached, as on every path: a batch is outside autograd)
            # a subclass (an nn.Parameter, whose requires_grad is kept; torchvision's
            # tv_tensors with their attributes), as torch's workers pickle them: (its
            # attributes pickled after, their tensors by reference too)
            state = dict(getattr(obj, "__dict__", {}))
            return pid + (cls, state, bool(obj.requires_grad))
        if np is not None and type(obj) is np.ndarray:
            return self.block.ref_array(obj)
        return None


class _LocalPickler(_BlockPickler):
    """_BlockPickler for a batch decoded in this process (no worker processes): classes and
    functions go by reference to this process's objects (objs), so that those pickle cannot
    name (a class defined in a function, a lambda) pass, as torch's num_workers=0 yields
    them; so does an object that does not reduce at all (a lock, a file) where it is one of
    the samples' (reached from them: passed through, or set by the collation from theirs),
    not a mapping or a sequence: an object the collation made (a dict subclass's
    `self.vals = self.values()`, a weakref to itself) or a container may refer to the
    collation's structure over the block's tensors, which a later batch's writes reach (its
    pickling error is raised)."""

    def __init__(self, f, block, samples=None):
        super().__init__(f, block)
        self.objs = []
        self.samples = samples
        self.theirs = None  # ids of the objects reached from the samples, once needed

    def persistent_id(self, obj):
        pid = super().persistent_id(obj)
        if pid is not None or type(obj) in _PLAIN_PICKLED:
            return pid
        if not isinstance(obj, (type, types.FunctionType)):
            if type(obj) in copyreg.dispatch_table or isinstance(obj, (_abc.Mapping,
                                                                       _abc.Sequence)):
                return None
            try:
                obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
                return None
            except Exception:  # noqa: BLE001 - pickle would raise it: kept by reference
                if self.samples is None:  # if it is the samples' own
                    return None
                if self.theirs is None:
                    self.theirs = _reached(self.samples)
                if id(obj) not in self.theirs:
                    return None
        self.objs.append(obj)
        return ("o", len(self.objs) - 1)


def _reached(roots, most=1 << 20):
    """ids of the objects reached from roots (through gc.get_referents; at most `most`),
    not through classes, modules, functions and code, nor into tensors and arrays."""
    seen = set()
    todo = [roots]
    stop = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
            types.CodeType, types.MethodType)
    while todo and len(seen) < most:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if (type(o) in _PLAIN or isinstance(o, stop)
                or (torch is not None and isinstance(o, torch.Tensor))
                or (np is not None and isinstance(o, np.ndarray))):
            continue
        todo.extend(gc.get_referents(o))
    return seen


class _BlockUnpickler(pickle.Unpickler):
    def __init__(self, f, view, objs=None):
        super().__init__(f)
        self.view = view
        self.objs = objs  # (_LocalPickler's)

    def persistent_load(self, pid):
        if pid[0] == "o":
            return self.objs[pid[1]]
        if pid[0] == "s":  # a sparse COO tensor (_BlockPickler)
            _, indices, values, shape, coalesced = pid
            return torch._sparse_coo_tensor_unsafe(indices, values, shape)._coalesced_(
                coalesced)
        kind, off, dtype, shape = pid[:4]
        if kind == "t":
            dt = getattr(torch, dtype)
            n = 1
            for d in shape:
                n *= d
            t = _leaf_tensor(self.view, dt, off, n * _itemsize(dt), shape)
            if len(pid) == 4:
                return t
            cls, state, grad = pid[4:]
            if cls is torch.nn.Parameter:
                return torch.nn.Parameter(t, requires_grad=grad)
            t = t.as_subclass(cls)
            t.__dict__.update(state)
            return t
        dt = np.dtype(dtype)
        n = 1
        for d in shape:
            n *= d
        return np.frombuffer(self.view, dtype=dt, count=n, offset=off).reshape(shape)


# ---- torch's default_collate, writing into the block ----------------------------------------

def _grad_error(e, tensors):
    """torch's error for an out= stack of tensors that require grad, made clear; None when
    none does (e is another error)."""
    if not any(getattr(t, "requires_grad", False) for t in tensors):
        return None
    return RuntimeError(
        "stoke: the samples' tensors require grad: a stoke.DataLoader writes each batch into its "
        "(pinned) batch memory, outside autograd, so the batch cannot carry their grad_fn "
        "(torch's DataLoader stacks them with a grad_fn with num_workers=0, and raises this "
        "error with workers). Detach them in the dataset (TensorDataset(x.detach()), or "
        "return t.detach() from __getitem__) (%s)" % (e,))


_DTYPE = operator.attrgetter("dtype")


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(x, "_fields")


_NOT_LEAVES = object()  # (_copy_leaves: a structure it does not copy leaf by leaf)
_SMALL_LEAF = 16 << 10  # leaves under this share one buffer of their batch (_LeafBuffers)


def _small_bytes(x):
    """The bytes _LeafBuffers keeps for x's small tensors and arrays (64-byte aligned)."""
    t = type(x)
    if t is list or t is tuple or (t is not str and _is_namedtuple(x)):
        return sum(map(_small_bytes, x))
    if t is dict:
        return sum(map(_small_bytes, x.values()))
    n = (x.numel() * x.element_size() if torch is not None and t is torch.Tensor
         else x.nbytes if np is not None and t is np.ndarray else _SMALL_LEAF)
    return _align64(max(n, 1)) if n < _SMALL_LEAF else 0  # (an empty one: a byte)


def _align64(n):
    return (n + 63) & ~63


class _LeafBuffers:
    """The buffers of a held batch's copied leaves: one each for the large ones, and one for
    all the small ones (a label, a length: a page of the pinned pool each, were they apart)."""

    def __init__(self, writer, pin, small):
        self.writer, self.pin = writer, pin
        self.pinned = None  # every buffer given out is pinned (None: none given out)
        self.small = memoryview(self._buffer(small)).cast("B") if small else None
        self.at = 0

    def _buffer(self, nbytes):
        buf = self.writer._held_buffer(nbytes, self.pin)
        self.pinned = bool(buf.pinned) and self.pinned is not False
        return buf

    def get(self, nbytes):
        if nbytes >= _SMALL_LEAF or self.small is None:
            return self._buffer(nbytes)
        part = self.small[self.at:self.at + max(nbytes, 1)]
        self.at += _align64(max(nbytes, 1))
        return part


def _copy_leaves(x, alloc):
    """x (a batch as decoded: tuples, lists, dicts, namedtuples of tensors, arrays, numbers
    and strings) with each tensor and array copied into a buffer of its own, alloc(nbytes)'s;
    _NOT_LEAVES for anything else (a subclass, an object of the user's)."""
    t = type(x)
    if torch is not None and t is torch.Tensor:
        if x.device.type != "cpu":
            return x  # (as ref_tensor: not in the block)
        if x.layout != torch.strided or x.is_quantized:
            return x.clone()  # (a sparse tensor's parts may view the block: its own memory)
        nb = x.numel() * x.element_size()
        dst = torch.frombuffer(alloc(nb), dtype=torch.uint8)[:nb].view(x.dtype).view(x.shape)
        return dst.copy_(x)
    if np is not None and t is np.ndarray:
        if x.dtype.kind not in _NP_KINDS or x.dtype.hasobject:
            return x  # (as ref_array: pickled, not in the block)
        dst = np.frombuffer(alloc(x.nbytes), dtype=np.uint8)[:x.nbytes].view(x.dtype)
        dst = dst.reshape(x.shape)
        dst[...] = x
        return dst
    if t is list or t is tuple or _is_namedtuple(x):
        items = [_copy_leaves(v, alloc) for v in x]
        if any(v is _NOT_LEAVES for v in items):
            return _NOT_LEAVES
        return items if t is list else t(items) if t is tuple else t(*items)
    if t is dict:
        items = {k: _copy_leaves(v, alloc) for k, v in x.items()}
        return _NOT_LEAVES if any(v is _NOT_LEAVES for v in items.values()) else items
    if t in (int, float, bool, str, bytes, type(None)):
        return x
    return _NOT_LEAVES


def _pad_value(path, v, dtype):
    """pad[path] checked for its leaf's dtype as torch's pad_sequence checks its padding_value
    (torch.tensor([v], dtype=...) wrapped it: -1 became 255 in uint8, 1e6 inf in float16): a
    number (a TypeError otherwise; a complex one for a complex leaf only), and a RuntimeError,
    torch's, when the dtype's range does not hold it (NaN or an infinity for an integer dtype);
    a float is truncated for an integer dtype, and any number is a bool's truth, as there."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 or np is not None and isinstance(
            v, np.generic):
        v = v.item()
    if not isinstance(v, numbers.Number) or (isinstance(v, numbers.Complex) and not isinstance(
            v, numbers.Real) and not dtype.is_complex):
        raise TypeError("stoke: pad[%r]: the pad value must be a %snumber, not %s %r"
                        % (path, "" if dtype.is_complex else "real ", type(v).__name__, v))
    if dtype == torch.bool:
        return v
    if dtype.is_floating_point or dtype.is_complex:
        lo, hi = torch.finfo(dtype).min, torch.finfo(dtype).max
        parts = (v.real, v.imag) if isinstance(v, complex) else (v,)
        # (infinities and NaN are a float's values; Python compares an int with them exactly)
        bad = any(not (isinstance(x, float) and (math.isinf(x) or math.isnan(x)))
                  and not lo <= x <= hi for x in parts)
    else:
        lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        bad = isinstance(v, float) and math.isnan(v) or not lo <= v <= hi
    if bad:
        raise RuntimeError("stoke: pad[%r]: the pad value %r cannot be converted to the leaf's "
                           "dtype %s without overflow (its range is %s to %s)"
                           % (path, v, str(dtype).replace("torch.", ""), lo, hi))
    return v


class _Collator:
    """default_collate's rules (torch.utils.data._utils.collate), the stacked tensors written
    straight into the block; leaves named in `pad` are padded to the batch's longest."""

    def __init__(self, pad, multiple_of, max_length, return_lengths):
        self.pad = dict(pad or {})
        self.multiple_of = multiple_of
        self.max_length = max_length
        self.return_lengths = return_lengths
        self.used = set()
        self.pad_bytes = {}  # (path, dtype): the pad value as one element's bytes
        self.seq_dtype = {}  # path: the dtype of a padded leaf's last non-empty list (_as_tensors)
        # num_workers=0: torch's default_collate stacks with type promotion (float32 and
        # float64 samples make a float64 batch); in a worker it stacks into a tensor of the
        # first sample's dtype (out=, casting), and so does stoke there (_Writer sets it)
        self.promote = False

    def __call__(self, block, batch):
        return self.collate(block, batch, "")

    def _max_len(self, path):
        m = self.max_length
        if isinstance(m, dict):
            return m.get(path)
        return m

    def pad_leaf(self, block, batch, path):
        """The leaf's tensors padded into the block (n, L, ...), and their lengths (n,): one C
        call checks them, copies the rows and writes the padding and the lengths (Python's
        checks and slices per sample cost several times as much at 32 token sequences a
        batch); torch copies what it does not take (tensors not contiguous or not on the CPU)."""
        cap = self._max_len(path)
        r = None
        if type(batch[0]) is torch.Tensor:
            r = self._pad_c(block, batch, path, cap)
        if r is None:  # not all tensors: as default_collate, each made one
            batch = self._as_tensors(batch, path)
            r = self._pad_c(block, batch, path, cap)
        if type(r) is int:
            t0, bad = batch[0], batch[r]
            raise RuntimeError(
                "stoke: pad[%r]: samples must have the same dtype and the same shape after "
                "the first dimension (%s %s, then %s %s)"
                % (path, t0.dtype, tuple(t0.shape), bad.dtype, tuple(bad.shape)))
        shape, lengths = r
        out = block.tensor(batch[0].dtype, shape)
        lens = block.tensor(torch.int64, shape[:1])
        if lengths is not None:  # not written by _pad_batch
            out.fill_(self.pad[path])
            for i, (t, n) in enumerate(zip(batch, lengths)):
                out[i, :n].copy_(t[:n])
            lens.copy_(torch.tensor(lengths, dtype=torch.int64))
        return out, lens

    def _as_tensors(self, batch, path):
        """A padded leaf's samples as tensors (torch.as_tensor).  An empty list or tuple (an
        empty token list) has no dtype of its own (torch.as_tensor makes it float32, and the
        batch failed: "samples must have the same dtype"): it takes the dtype and the trailing
        shape of the batch's first other sample, as pad_sequence over tensors of that dtype
        pads it.  A batch of empty ones only takes the dtype of this leaf's last batch made
        in this process that had another sample, else float32 (torch.as_tensor([]))."""
        ts = [torch.as_tensor(x) for x in batch]
        empty = [i for i, x in enumerate(batch) if type(x) in (list, tuple) and not x]
        if not empty:
            self.seq_dtype[path] = ts[0].dtype
            return ts
        if len(empty) == len(ts):
            dtype = self.seq_dtype.get(path, ts[0].dtype)
            return [torch.empty(0, dtype=dtype) for _ in ts]
        ref = next(t for i, t in enumerate(ts) if i not in empty)
        self.seq_dtype[path] = ref.dtype
        for i in empty:
            ts[i] = torch.empty((0,) + tuple(ref.shape[1:]), dtype=ref.dtype)
        return ts

    def _pad_c(self, block, ts, path, cap):
        dtype = ts[0].dtype
        return _stoke._pad_batch(block.view, block.off, ts, torch.Tensor, _itemsize(dtype), cap,
                                 self.multiple_of or 0, self._pad_bytes(path, dtype))

    def _pad_bytes(self, path, dtype):
        key = (path, dtype)
        b = self.pad_bytes.get(key)
        if b is None:
            v = _pad_value(path, self.pad[path], dtype)
            b = self.pad_bytes[key] = bytes(
                torch.tensor([v], dtype=dtype).view(torch.uint8).tolist())
        return b

    def collate(self, block, batch, path):
        elem = batch[0]
        if type(elem) is _Row:
            out = elem.out
            if len(batch) == len(out) and all(type(b) is _Row and b.out is out for b in batch):
                return out  # stacked already, a row as each sample came
            # a sample's leaf did not fit its row: torch's stack (its casts, or its error)
            batch = [b.out[b.k] if type(b) is _Row else b for b in batch]
            try:
                if self.promote:  # torch.stack's type promotion, as torch's num_workers=0
                    res = torch.stack(batch, 0)
                    if res.requires_grad:
                        raise RuntimeError("stack(): the result requires grad")
                    if res.dtype != out.dtype:
                        out = block.tensor(res.dtype, tuple(res.shape))
                else:
                    res = torch.stack(batch, 0, out=torch.empty(0, dtype=out.dtype))
            except RuntimeError as e:
                err = _grad_error(e, batch)
                if err is None:
                    raise
                raise err from e
            out.copy_(res)
            return out
        if path in self.pad and torch is not None:
            self.used.add(path)
            out, lens = self.pad_leaf(block, batch, path)
            return _Padded(out, lens) if self.return_lengths else out
        if torch is not None and isinstance(elem, torch.Tensor):
            if elem.layout is not torch.strided or elem.is_quantized:
                # (sparse, quantized: stacked as torch's num_workers=0, then pickled whole;
                # out= has no sparse cat, and a quantized out= in the block has no qscheme)
                return torch.stack(batch, 0)
            if elem.device.type != "cpu":
                # (a dataset of CUDA tensors): stacked on their device, as torch's default_collate
                # does, and kept by reference (_Block.shape), not written into the block
                if not self.promote:  # a worker's: torch's workers cannot make it either
                    raise RuntimeError(
                        "stoke: %s: the samples' tensors are on device %s, which a worker "
                        "process cannot collate (nor can torch's); give the dataset CPU "
                        "tensors and move the batch, or use num_workers=0"
                        % ("batch" + ("." + path if path else ""), elem.device))
                return torch.stack(batch, 0)
            out = block.tensor(elem.dtype, (len(batch),) + tuple(elem.shape))
            try:
                try:
                    res = torch.stack(batch, 0, out=out)
                    stacked = True
                except RuntimeError:
                    if not self.promote:
                        raise
                    stacked = False  # (a float after an int: a cast out= refuses; below)
                if self.promote:
                    # mixed dtypes: the promoted one, as torch.stack without out= makes it
                    # (checked after the stack, which brought the samples into the cache: one
                    # C-level pass over the column); the batch is stacked again
                    dts = list(map(_DTYPE, batch))
                    if dts.count(elem.dtype) != len(dts):
                        dtype = elem.dtype
                        for d in set(dts):
                            dtype = torch.promote_types(dtype, d)
                        out = block.tensor(dtype, (len(batch),) + tuple(elem.shape))
                        res = torch.stack(batch, 0, out=out)
                    elif not stacked:
                        res = torch.stack(batch, 0, out=out)  # (its error: not the dtypes)
            except RuntimeError as e:
                err = _grad_error(e, batch)
                if err is None:
                    raise
                raise err from e
            if self.promote and type(elem) is not torch.Tensor and type(res) is not type(out):
                # samples of a tensor subclass: the type torch.stack gives (torch's
                # num_workers=0 keeps it through __torch_function__; nn.Parameter's is
                # disabled: a plain tensor), over the block's bytes
                return res
            return out
        if np is not None and isinstance(elem, np.ndarray):
            if elem.dtype.kind not in _NP_KINDS or elem.dtype.hasobject:
                return list(batch)
            if torch is not None:
                return self.collate(block, [torch.as_tensor(b) for b in batch], path)
            out = block.array(elem.dtype, (len(batch),) + elem.shape)[0]
            np.stack(batch, out=out)
            return out
        if np is not None and isinstance(elem, (np.number, np.bool_)):
            if torch is None:
                return np.array(batch)
            t = type(elem)
            if all(type(b) is t for b in batch):  # (one type: NumPy's array is the same, faster)
                return torch.as_tensor(np.array(batch))
            # mixed (an np.float32 and a float, an np.int32 and an np.float32): torch's own
            # promotion (float32), as default_collate's torch.as_tensor(batch); NumPy's is float64
            return torch.as_tensor(batch)
        if isinstance(elem, float):
            return torch.tensor(batch, dtype=torch.float64) if torch is not None else \
                np.array(batch, dtype=np.float64)
        if isinstance(elem, int):
            return torch.tensor(batch) if torch is not None else np.array(batch)
        if isinstance(elem, (str, bytes)):
            return batch  # as default_collate: the list, or a column of a tuple sample
        if isinstance(elem, _abc.Mapping):
            out = {}
            for key in elem:
                sub = path + "." + str(key) if path else str(key)
                v = self.collate(block, [d[key] for d in batch], sub)
                if isinstance(v, _Padded):
                    out[key] = v.out
                    out[str(key) + "_lengths"] = v.lengths
                else:
                    out[key] = v
            try:
                return type(elem)(out)
            except TypeError:
                return out
        if _is_namedtuple(elem):
            return type(elem)(*(self._unpad(self.collate(block, s, _sub(path, i)))
                                for i, s in enumerate(zip(*batch))))
        if isinstance(elem, _abc.Sequence):
            n = len(elem)
            if any(len(e) != n for e in batch):
                raise RuntimeError("each element in list of batch should be of equal size")
            cols = [self._unpad(self.collate(block, s, _sub(path, i)))
                    for i, s in enumerate(zip(*batch))]
            if isinstance(elem, tuple):
                return cols
            try:
                return type(elem)(cols)
            except TypeError:
                return cols
        # None, complex numbers and other objects: passed through, by design, as a list (even
        # a column of tuple samples, which zip made a tuple); torch raises a TypeError
        return list(batch)

    @staticmethod
    def _unpad(v):
        return (v.out, v.lengths) if isinstance(v, _Padded) else v


def _sub(path, i):
    return path + "." + str(i) if path else str(i)


class _Padded:
    __slots__ = ("out", "lengths")

    def __init__(self, out, lengths):
        self.out = out
        self.lengths = lengths


class _Row:
    """Sample k's tensor leaf, already copied into row k of the batch tensor `out` in the
    block (the row-streaming fetch, _Writer.rows): collate returns `out` for a column of them."""
    __slots__ = ("out", "k")

    def __init__(self, out, k):
        self.out = out
        self.k = k


def _convert(x):
    """default_convert (batch_size=None): arrays become tensors, the rest stays."""
    if torch is None:
        return x
    if np is not None and isinstance(x, np.ndarray) and x.dtype.kind in _NP_KINDS:
        return torch.as_tensor(x)
    if np is not None and isinstance(x, (np.number, np.bool_)):
        return torch.as_tensor(x)
    if isinstance(x, _abc.Mapping):
        try:
            return type(x)({k: _convert(v) for k, v in x.items()})
        except TypeError:
            return {k: _convert(v) for k, v in x.items()}
    if _is_namedtuple(x):
        return type(x)(*(_convert(v) for v in x))
    if isinstance(x, tuple):
        return [_convert(v) for v in x]
    if isinstance(x, _abc.Sequence) and not isinstance(x, (str, bytes)):
        try:
            return type(x)([_convert(v) for v in x])
        except TypeError:
            return [_convert(v) for v in x]
    return x


# ---- the plan: the epoch's batches, seeds and error mailboxes, shared with the workers -----

class _Plan:
    """Shared with the workers (made before they fork): a header, the mailboxes and the
    epoch's batch offsets in one anonymous shared mapping; the indices in a memfd that grows
    (a worker maps it again when the header says it grew)."""
    H_EPOCH, H_NBATCH, H_SEED, H_NIDX, H_IDXCAP = 0, 1, 2, 3, 4
    H_RUN = 5  # an iterable's runs: each new one iterates the dataset from its start again
    H_LISTS = 6  # 1: each batch is one __getitem__ call with its list of keys (batch_size=None)
    H_PATCH = 7  # bytes in patch_fd: the dataset's attributes set since the fork (set_patch)
    H_OFFCAP = 8  # batches the offsets' memfd holds (+ 1)
    H_LIVE = 9  # 1: the C loader asks the epoch's batches (H_NBATCH) for the dataset's length
    H_AGAIN = 10  # a map epoch's plans made again (_Writer.again): its workers start it again
    H_PASS = 11  # the passes begun (each set_epoch hook but a plan made again)
    H_CUT = 12  # 1: the pass before H_PASS's was left before its end (_Writer.pass_reseed)
    H_KEYS = 13  # the type of the sampler's keys: 0 ints, else _key_kind's code (_key_objs)
    H_PIPE = 14  # an IterDataPipe's pass: the seed of its random pipes (_Writer.seed_pipe)

    def __init__(self, nbatches, nidx, nmail, entries=MAIL_ENTRIES, patch=False):
        self.nmail = nmail
        self.entries = max(entries, MAIL_ENTRIES)
        self.mailbox = 4096 + self.entries * MAIL_ENTRY  # (its header page: entries used)
        self.off_mail = 4096
        size = self.off_mail + nmail * self.mailbox
        self.mm = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS: the forked workers see it
        self.head = np.frombuffer(self.mm, dtype=np.int64, count=16, offset=0)
        self.cur = np.frombuffer(self.mm, dtype=np.int64, count=min(nmail, 448), offset=512)
        self.cur_mv = memoryview(self.mm)[512:512 + 8 * len(self.cur)].cast("q")  # (writes)
        # The epoch's batches: their count (H_NBATCH: it may change from epoch to epoch, as
        # a sampler's or the dataset's length does), the offsets of each one's indices, and
        # the indices, in two memfds that grow (a worker maps one again when the header says
        # it grew)
        self.fd = os.memfd_create("stoke-plan", os.MFD_CLOEXEC)
        self.offs_fd = os.memfd_create("stoke-plan-offsets", os.MFD_CLOEXEC)
        # (with worker processes) the attributes the consumer set on the dataset since the
        # workers were forked, pickled: each worker sets them on its copy (_Writer.ship_changes)
        self.patch_fd = os.memfd_create("stoke-patch", os.MFD_CLOEXEC) if patch else -1
        # the memfds are this plan's: closed with it (one per loader was left open, so a
        # script making a loader per epoch ran out of descriptors after ~1000)
        weakref.finalize(self, _close_fds, self.fd, self.offs_fd, self.patch_fd)
        self.wrap = 0  # rows of a TensorDataset: negative indices count from this length
        self.bound = None  # the most batches an epoch may have (the C loader's, in_order=False)
        self.idx_mm = self.offs_mm = None
        self.idx = self.offs = None
        self._map_idx(max(nidx, 512))
        self._map_offs(max(nbatches, 0) + 1)
        self.head[self.H_NBATCH] = max(nbatches, 0)  # (the lengths' count until a plan)

    def _map(self, fd, n, old):
        if old is not None:
            old.close()
        if os.fstat(fd).st_size < 8 * n:
            os.ftruncate(fd, 8 * n)
        mm = mmap.mmap(fd, 8 * n)
        return mm, np.frombuffer(mm, dtype=np.int64, count=n)

    def _map_idx(self, n):
        self.idx = None
        self.idx_mm, self.idx = self._map(self.fd, n, self.idx_mm)
        self.head[self.H_IDXCAP] = n

    def _map_offs(self, n):
        self.offs = None
        self.offs_mm, self.offs = self._map(self.offs_fd, n, self.offs_mm)
        self.head[self.H_OFFCAP] = n

    def nbatches(self):
        """The planned epoch's batches."""
        return int(self.head[self.H_NBATCH])

    def write(self, epoch, batches, base_seed, lists=False, keys=0):
        """The epoch's batches: a list of index lists, or (order, batch_size, drop_last) for
        an order cut into batches (no sampler: written without a Python list).  lists: each
        batch is one __getitem__ call with its list of keys (H_LISTS).  keys: the type of the
        sampler's keys (H_KEYS, _key_kind)."""
        if isinstance(batches, tuple):
            order, bs, drop_last = batches
            nb = len(order) // bs if drop_last else -(-len(order) // bs)
            n = min(len(order), nb * bs)
        else:
            nb, n = len(batches), sum(len(b) for b in batches)
        if self.bound is not None and nb > self.bound:
            raise RuntimeError(
                "stoke: epoch %d has %d batches, more than the %d this DataLoader "
                "(in_order=False, whose C loader keeps a bit per batch) was made for, 4 times "
                "its batches at construction: make a new DataLoader for the longer epochs"
                % (epoch, nb, self.bound))
        if n > len(self.idx):
            self._map_idx(max(n, 2 * len(self.idx)))
        if nb + 1 > len(self.offs):
            self._map_offs(max(nb + 1, 2 * len(self.offs)))
        if isinstance(batches, tuple):
            self.idx[:n] = order[:n]
            self.offs[:nb + 1] = np.minimum(np.arange(nb + 1, dtype=np.int64) * bs, n)
        else:
            pos = 0
            for i, b in enumerate(batches):
                self.offs[i] = pos
                self.idx[pos:pos + len(b)] = b
                pos += len(b)
            self.offs[nb] = pos
        self.head[self.H_EPOCH] = epoch
        self.head[self.H_NBATCH] = nb
        self.head[self.H_SEED] = base_seed
        self.head[self.H_NIDX] = n
        self.head[self.H_LISTS] = int(lists)
        self.head[self.H_KEYS] = keys
        if self.wrap and n:  # a TensorDataset's rows: ds[-1] is the last, as torch's indexing
            v = self.idx[:n]
            neg = v < 0
            if neg.any():
                v[neg] += self.wrap

    def set_patch(self, data):
        """The consumer, while no worker process starts a pass: data (pickled) replaces the
        patch the workers read at their next pass's start (patch())."""
        view = memoryview(data)
        while view:
            view = view[os.pwrite(self.patch_fd, view, len(data) - len(view)):]
        os.ftruncate(self.patch_fd, len(data))
        self.head[self.H_PATCH] = len(data)

    def patch(self):
        """A worker process: the patch's bytes (b"": none)."""
        n = int(self.head[self.H_PATCH])
        out = bytearray()
        while len(out) < n:
            got = os.pread(self.patch_fd, n - len(out), len(out))
            if not got:
                raise OSError("stoke: the dataset's patch was cut at %d of %d bytes"
                              % (len(out), n))
            out += got
        return bytes(out)

    def batch(self, i):
        if self.head[self.H_IDXCAP] != len(self.idx):  # a worker: the consumer grew it
            self._map_idx(int(self.head[self.H_IDXCAP]))
        if self.head[self.H_OFFCAP] != len(self.offs):
            self._map_offs(int(self.head[self.H_OFFCAP]))
        return self.idx[self.offs[i]:self.offs[i + 1]]

    def base_seed(self):
        return int(self.head[self.H_SEED])

    def mail_put(self, worker, batch, payload):
        """Keeps a failure for the consumer in a free entry of the worker's mailbox (one
        writer each: a worker process, thread, or the caller's thread): a worker goes on
        loading after a failure, and the consumer takes each when it reaches its batch.  A full
        mailbox keeps what it has (the batch's error is then the loader's, with the text)."""
        box = self.off_mail + min(max(worker, 0), self.nmail - 1) * self.mailbox
        used = struct.unpack_from("<Q", self.mm, box)[0]
        for k in range(min(used + 1, self.entries)):
            off = box + 4096 + k * MAIL_ENTRY
            # free: no length (batch + 1 is 0 for an unnumbered batch, -1, which is kept)
            if k == used or struct.unpack_from("<Q", self.mm, off + 8)[0] == 0:
                self.mm[off + 16:off + 16 + len(payload)] = payload
                struct.pack_into("<QQ", self.mm, off, batch + 1, len(payload))
                if k == used:
                    struct.pack_into("<Q", self.mm, box, used + 1)  # (after the entry)
                return

    def _used(self):
        """(offset of each used entry) of every mailbox."""
        for slot in range(self.nmail):
            box = self.off_mail + slot * self.mailbox
            used = min(struct.unpack_from("<Q", self.mm, box)[0], self.entries)
            for k in range(used):
                yield box + 4096 + k * MAIL_ENTRY

    ITER_FRESH, ITER_LOST, ITER_DONE = 0, 1, 2

    def began(self, worker, run):
        """Where worker process `worker`'s iterator of run `run` is: ITER_LOST if a process
        before it began it and died (the iterator died with it), ITER_DONE if one before it
        exhausted it (it died after: nothing is lost), else ITER_FRESH, marked begun now.
        The word after the entry count in the worker's mailbox header page: run + 1 begun,
        -(run + 1) exhausted."""
        off = self.off_mail + min(max(worker, 0), self.nmail - 1) * self.mailbox + 8
        word = struct.unpack_from("<q", self.mm, off)[0]
        if word == run + 1:
            return self.ITER_LOST
        if word == -(run + 1):
            return self.ITER_DONE
        struct.pack_into("<q", self.mm, off, run + 1)
        return self.ITER_FRESH

    def exhausted(self, worker, run):
        """Worker process `worker`'s iterator of run `run` ended (began's ITER_DONE)."""
        off = self.off_mail + min(max(worker, 0), self.nmail - 1) * self.mailbox + 8
        struct.pack_into("<q", self.mm, off, -(run + 1))

    def mail_take(self, batch):
        for off in self._used():
            b1, n = struct.unpack_from("<QQ", self.mm, off)
            if b1 == batch + 1 and n:
                data = bytes(self.mm[off + 16:off + 16 + n])
                struct.pack_into("<QQ", self.mm, off, 0, 0)
                return data
        return None

    def mail_clear(self):
        """At an epoch's start (no worker is loading): failures nobody took are stale."""
        for off in self._used():
            struct.pack_into("<QQ", self.mm, off, 0, 0)
        for slot in range(self.nmail):
            struct.pack_into("<Q", self.mm, self.off_mail + slot * self.mailbox, 0)


# The type of a pass's keys, in the plan's H_KEYS: 0 ints (or keys of several types), else
# 1 + its place here, NumPy's integer scalars then torch's 0-dim tensors (a fixed table: the
# worker processes read the code, forked before any pass)
_NP_KEYS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_TORCH_KEYS = ("int8", "int16", "int32", "int64", "uint8")


def _key_kind(items):
    """H_KEYS of a list of keys (or of an array or tensor of them): 0 unless every key is a
    NumPy integer scalar of one dtype, or a CPU 0-dim torch tensor of one integer dtype."""
    t = type(items)
    if np is not None and t is np.ndarray:
        name = items.dtype.name
        return 1 + _NP_KEYS.index(name) if name in _NP_KEYS else 0
    if torch is not None and t is torch.Tensor:
        name = str(items.dtype)[6:]
        return 1 + len(_NP_KEYS) + _TORCH_KEYS.index(name) if name in _TORCH_KEYS else 0
    if not items or type(items[0]) is int:  # (the common case: one look)
        return 0
    k0 = items[0]
    t = type(k0)
    if np is not None and isinstance(k0, np.integer) and k0.dtype.name in _NP_KEYS:
        code = 1 + _NP_KEYS.index(k0.dtype.name)
        same = all(type(k) is t for k in items)
    elif torch is not None and t is torch.Tensor and str(k0.dtype)[6:] in _TORCH_KEYS:
        code = 1 + len(_NP_KEYS) + _TORCH_KEYS.index(str(k0.dtype)[6:])
        dt = k0.dtype
        same = all(type(k) is t and k.dtype is dt and k.dim() == 0 and k.device.type == "cpu"
                   for k in items)
    else:
        return 0
    return code if same else 0


def _key_objs(indices, code):
    """The keys H_KEYS `code` says the sampler gave, made again from the plan's ints, for
    __getitem__ (torch passes the sampler's keys as they are)."""
    if code <= len(_NP_KEYS):
        return list(np.array(indices, dtype=_NP_KEYS[code - 1]))
    dt = getattr(torch, _TORCH_KEYS[code - 1 - len(_NP_KEYS)])
    return [torch.tensor(j, dtype=dt) for j in indices]


def _keys(items, what="sampler", kinds=None):
    """A sampler's keys as a list of ints: ints (bool included) and NumPy or torch integer
    scalars (operator.index), as int64 in the plan; anything else (a str, a float) is a
    TypeError, where torch would pass it to __getitem__ as it is (int() would have made 1.7
    index 1 and "10" index 10: silently other samples).  kinds (a list): the keys' H_KEYS
    code is appended (_key_kind), so that __getitem__ gets them as the sampler gave them."""
    if np is not None and type(items) is np.ndarray and items.dtype.kind in "iub":
        if kinds is not None:
            kinds.append(_key_kind(items))
        return items.tolist()
    if torch is not None and type(items) is torch.Tensor and not (
            items.is_floating_point() or items.is_complex()):
        if kinds is not None:
            kinds.append(_key_kind(items))
        return items.tolist()
    if type(items) is not list:
        items = list(items)
    if kinds is not None:
        kinds.append(_key_kind(items))
    try:
        return list(map(operator.index, items))
    except TypeError:
        pass
    for k in items:
        try:
            operator.index(k)
        except TypeError:
            raise TypeError(
                "stoke: the %s gave the key %r (%s): a stoke.DataLoader needs integer dataset "
                "indices (int, or a NumPy or torch integer scalar), which it plans for its "
                "workers as int64; torch would pass the key to __getitem__ as it is. Give the "
                "dataset integer positions (a sampler over range(len(ds)), __getitem__(i) "
                "looking up keys[i])" % (what, k, type(k).__name__)) from None
    return list(map(operator.index, items))  # (a key that failed only once)


def _sampler_len(s, what):
    """len(sampler), or None for one without a length: no __len__, or one that raises
    TypeError (a BatchSampler over a sampler without one) or NotImplementedError (torch makes
    it optional: only len(loader) needs it, and raises its error then)."""
    try:
        return len(s)
    except (TypeError, NotImplementedError):
        return None


def _stateless(s):
    """A sampler that is a plain sequence of indices (or of index lists): iterating it draws
    nothing and always ends."""
    return type(s) in (list, tuple, range) or (np is not None and type(s) is np.ndarray) or (
        torch is not None and type(s) is torch.Tensor)


def _one_pass(s, what, n, ds_len=0):
    """One pass over sampler (batch_sampler) s, as a list: a list, tuple, range, array or tensor
    as it is; an object's iterator, of which at most _pass_most(n) + 1 items are drawn (n: its
    len(), which it may miss, as a bucketing batch_sampler's estimate: torch's DataLoader uses
    it only for len(loader)), so that one that yields without end (an infinite sampler, as
    mmengine's InfiniteSampler: torch's epoch over it never ends) is a ValueError, not a list
    that grows until memory runs out."""
    if _stateless(s):
        return s
    most = _pass_most(n, ds_len)
    items = list(itertools.islice(s, most + 1))  # (iter(s) once, as list(s) and torch)
    if len(items) > most:
        raise ValueError(
            "stoke: the %s (%s) yields more than %d items in one pass, %s, or twice the "
            "dataset's length, and 65,536 more (an infinite "
            "sampler?): a stoke.DataLoader plans each epoch from "
            "one pass over the %s, which must end (torch's DataLoader would iterate it without "
            "end). Make the %s's __iter__ end after one epoch's items, or use a finite sampler "
            "such as RandomSampler(ds, num_samples=N), and iterate the loader once per epoch"
            % (what, type(s).__name__, most,
               "4 times its len(), %d" % n if n is not None else
               "2^22 for one without a length", what, what))
    return items


def _pass_most(n, ds_len=0):
    """The most items one pass of a sampler whose len() is n (None: it has none) over a
    dataset of ds_len may yield (_one_pass)."""
    return max(4 * n if n is not None else _PASS_NO_LEN, 2 * ds_len) + 65536


# the most items of a pass over a sampler without a length, unless the dataset's length says more
# (a list of 4 Mi ints: ~150 MB)
_PASS_NO_LEN = 1 << 22


def _is_key_list(k):
    """A sampler's item that is a batch of keys (BatchSampler as sampler, batch_size=None:
    torch passes the list to __getitem__)."""
    return isinstance(k, (list, tuple)) or (np is not None and isinstance(k, np.ndarray)) or (
        torch is not None and isinstance(k, torch.Tensor) and k.dim() == 1)


def _permutation(n, seed, epoch):
    """stoke's shuffle without a sampler: a permutation keyed by (seed, epoch), independent of
    the workers (a restored position recomputes it)."""
    rng = np.random.Generator(np.random.PCG64([seed & (2**64 - 1), epoch]))
    return rng.permutation(n)


# ---- the writer the C loader calls ------------------------------------------------------------

class _Writer:
    def __init__(self, dataset, iterable, batch_size, drop_last, sampler, batch_sampler,
                 shuffle, seed, generator, collate_fn, worker_init_fn, num_workers, processes,
                 persistent, pad, pad_to_multiple_of, max_length, return_lengths, rank, world,
                 mail_entries=MAIL_ENTRIES):
        self.dataset = dataset
        self.dataset0 = None      # a worker's dataset's attributes as forked (fresh_dataset)
        self.iterable = iterable
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.shuffle = shuffle
        self.seed = seed          # the shuffle's; None: drawn each pass (shuffle_seed)
        self.epoch_seed = seed    # the shuffle seed of the epoch planned last
        self.restore_seed = None  # load_state_dict: the saved epoch's, instead of a draw
        self.base_fixed = None    # persistent workers: the base seed they were seeded with
        self.base_again = None    # again(): the next set_epoch hook's base seed
        self.generator = generator
        self.collate_fn = collate_fn
        self.collator = _Collator(pad, pad_to_multiple_of, max_length, return_lengths)
        self.collator.promote = num_workers == 0  # (torch's workers stack into out=)
        self.worker_init_fn = worker_init_fn
        self.num_workers = num_workers
        self.processes = processes
        self.persistent = persistent
        self.rank, self.world = rank, world
        self.name = "python:" + type(dataset).__name__
        # torch calls __getitems__ with automatic batching only (batch_size=None: ds[i])
        self.getitems = getattr(dataset, "__getitems__", None) if (
            batch_size is not None or batch_sampler is not None) else None
        self.keyed = batch_size is None and sampler is not None and batch_sampler is None
        self.tensors = _tensor_rows(dataset)
        self.rows_path = (self.tensors is not None and collate_fn is None and not pad
                          and not (batch_size is None and batch_sampler is None))
        self.worker = -2          # -2: the consumer's process; -1: the zygote; >= 0: a worker
        self.seeded_epoch = None
        self.seeded_base = None
        self.seeded_again = 0
        self.epoch_rngs = None  # a worker process's RNG states at its epoch's start
        self.seen_pass = None  # a worker process's last pass (H_PASS)
        self.pass_ended = False  # the consumer's: its last pass's iterator reached its end
        # the consumer's: a pass's batches were asked for (the workers started: persistent ones
        # make the batches of each later pass from its start, asked for or not)
        self.workers_began = False
        self.cut_pending = None  # a worker process's: the pass to reseed for once seeded
        self.rng_after = None     # the RNG's state after the construction's base-seed draw
        self.reseed_only = False  # the next set_epoch hook draws the seed, keeps the batches
        self.iters = {}
        self.iter_lock = threading.Lock()
        self.fill_lock = threading.Lock()
        self.warned_over = False
        # batches that outgrew their block, each made in memory of its own (spill): (pid,
        # seq) -> its view (made in this process) or its memfd (received from a worker
        # process through its socket pair, made before the fork: one a worker, so that the
        # memfd of the batch the consumer waits for is never behind those of later batches
        # of other workers in a full queue, whose senders would wait for the consumer)
        self.spills = {}
        self.spill_seq = 0
        self.spill_lock = threading.Lock()
        self.spill_socks = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                            for _ in range(num_workers if processes else 0)]
        for pair in self.spill_socks:
            for sock in pair:
                sock.setblocking(False)  # (Python 3.11's send_fds and recv_fds drop flags=)
        if self.spill_socks:
            weakref.finalize(self, _close_spills, self.spills, self.spill_socks)
        self.warned_copy = False
        self.interrupt = None     # a fill's KeyboardInterrupt or SystemExit (interrupted())
        self.kept_errors = {}     # exceptions too long for a mailbox, made here (keep_error)
        self.init_failure = None  # a worker_init_fn's exception, as mailed (reraise)
        self.pin = False          # the loader's pin_memory: a custom batch's pin_memory() is called
        self.rows = False         # samples' tensors copied into the block as they come (measure)
        self.plan = None
        # batches made in this process (no worker processes) keep their structure here
        self.live = None if processes else {}
        self.fast = set()  # skeletons this process's fills sent (_Block.finish_fast)
        self.builders = _Builders()  # the consumer's compiled skeletons
        self.kept = None          # batch 0 made by measure() in this process (_Kept)
        self.preplanned = False   # measure() wrote epoch 0's plan: the creation's hook keeps it
        # (before, after): _ctor_states() before the construction's draws and after them (it
        # set them back to before), until the first iteration replays them (or a set_epoch
        # hook drew anew first)
        self.ctor_states = None
        self.ctor_moved = False      # replay_construction found an RNG moved
        self.base_rng_moved = False  # ... the base seed's: rng_moved() until the next draw
        self.replayed = ()           # the global RNGs it set (_rng_states' positions)
        self.nbatches = -1
        self.blob_bytes = 0
        self.data_bytes = 0       # the batches' bytes the consumer took (stats()["bytes"])
        self.sparse = False       # blocks of address space, their pages made as written (grow())
        self.pin_lazy = False     # ... and pinned as used (pin_on_use, Batch._pin: pinned())
        self.warned_pin = False
        # batches whose tensors are in pinned memory the C loader did not count as such (held
        # copies and spills copied into the pinned pool from a block that is not pinned), less
        # those it counted pinned whose copies are ordinary memory: stats() adds it
        self.pin_delta = 0
        self.probe_pid = None     # measure()'s child, answered and exiting: reap_probe() reaps it
        self.iter_map = iterable and processes
        # an IterDataPipe: torch's DataLoader seeds its random pipes each pass and shards it
        # over the workers (seed_pipe, start_worker_epoch)
        self.pipe = iterable and _is_iter_pipe(dataset)
        self.restore_pipe = None  # load_state_dict: the saved pass's pipe seed, not a draw
        self.lists = False        # batches() of the epoch: each batch one call with its keys
        self.keys = 0             # batches() of the epoch: its keys' type (_Plan.H_KEYS)
        # A sampler (batch_sampler) object: its order is taken when iteration starts, as
        # torch's iter() does (sampler.set_epoch() after the loader is made counts), not at
        # construction: the creation's set_epoch hook leaves the plan to the first iteration
        # (plan_now), and nothing here iterates it before (measure() forks its probe).  A
        # list, tuple, range, array or tensor of indices has no state: read at construction.
        self.defer = not iterable and not self.static_order() and (
            sampler is not None or batch_sampler is not None)
        self.planned = True       # False: the first iteration writes the epoch's plan
        # num_workers=0 with a sampler object: iter()'s hooks leave the sampler's read to the
        # pass's first next() (plan_pending), as torch's single-process iterator draws its
        # indices lazily (a sampler.set_epoch() between iter() and next() counts)
        self.lazy = False         # DataLoader._pass sets it around iter()'s hooks
        self.pending = False      # the plan of H_EPOCH waits for the first next()
        self.planned_len = None   # len(dataset) the last plan without a sampler was of
        self.iter_run = -1        # the plan's H_RUN this worker process's iterators are of
        self.iter_at = 0          # its run's iterator: _Plan.ITER_FRESH, LOST or DONE
        if self.iter_map:
            # The C loader's worker processes take MAP datasets: batch i is then the next
            # batch of whichever worker's iterator fills it, and an exhausted worker answers
            # with an END block; the epoch ends when every worker has sent one.  An
            # IterableDataset's __len__ does not bound the epoch (torch delivers whatever the
            # iterators yield; its length may be an estimate): _ITER_BATCHES at most, with a
            # warning when an epoch reaches it (DataLoader._batches).
            self.nbatches = _ITER_BATCHES
            nb0 = nidx = 0
        elif not iterable:
            # The C loader's length is a bound, not the epoch's batches: those are planned at
            # each epoch's start, from the sampler's pass (or the dataset's length) of then, as
            # torch's iterator takes them; batch i past them is an END block (fill_one), and
            # the pass ends at the first (DataLoader._batches).  So a dataset whose length
            # changes, or a batch_sampler whose count varies (bucketing by length, a token
            # budget), is iterated as torch iterates it.
            nb0, nidx = self.count()  # 0: an empty epoch, as torch's
            nb0 = nb0 or 0
            self.nbatches = _ITER_BATCHES
        else:
            nb0, nidx = 0, 0
        # (the plan's batch offsets are a MAP dataset's: an iterable's batches are not planned)
        self.plan = _Plan(nb0, nidx, num_workers + 1, mail_entries, patch=processes)
        # (pywriter.c's length(): the planned epoch's batches, once the C loader is made)
        addr = self.plan.head.ctypes.data
        self.live_length = None if iterable else (addr + 8 * _Plan.H_NBATCH,
                                                  addr + 8 * _Plan.H_LIVE)
        # (worker processes) the dataset's attributes when they were forked, and when the
        # changes since were last shipped to them (ship_changes); the names that could not be
        # shipped, with why; whether the first pass began (persistent workers take no later
        # change, as torch's)
        self.ds_ids = None
        self.shipped = None
        self.unsent = {}
        self.started = False
        if self.rows_path:
            self.plan.wrap = len(self.tensors[0])

    # -- the epoch's batches (consumer's process) --

    def count(self):
        """Batches per epoch and indices, from the lengths (torch's len(loader)), without
        iterating the sampler: its draws happen when an epoch starts, as torch's do.  A
        sampler without __len__: (None, 512), the epoch's batches known from its pass."""
        if self.batch_sampler is not None:
            n = _sampler_len(self.batch_sampler, "batch_sampler")
            return (n, n * 8) if n is not None else (None, 512)
        if self.sampler is not None:
            n = _sampler_len(self.sampler, "sampler")
            if n is None:
                return None, 512
        else:
            n = len(self.dataset)
            if self.world > 1:
                n = -(-n // self.world)
        bs = self.batch_size
        if bs is None:
            return n, n
        return (n // bs if self.drop_last else -(-n // bs)), n

    def one_pass(self, s, what):
        """_one_pass over sampler (batch_sampler) s, bound by its length and the dataset's."""
        try:
            n = len(self.dataset)
        except (TypeError, NotImplementedError):
            n = 0
        return _one_pass(s, what, _sampler_len(s, what), n)

    def sample_order(self, epoch, kinds=None):
        """The epoch's dataset indices in order: a list (a sampler's) or an int64 array."""
        if self.sampler is not None:
            # batch_size is set here (batches())
            return _keys(self.one_pass(self.sampler, "sampler"), kinds=kinds)
        n = self.planned_len = len(self.dataset)
        order = _permutation(n, self.shuffle_seed(), epoch) if self.shuffle else np.arange(n)
        if self.world > 1:  # DistributedSampler's split: padded to a multiple of the ranks
            per = -(-n // self.world)
            total = per * self.world
            if total > n:
                order = np.concatenate([order, order[:total - n]])
            order = order[self.rank:total:self.world]
        return order

    def batches(self, epoch):
        """The epoch's batches for _Plan.write: lists of indices, or (order, batch_size,
        drop_last) without a sampler.  Sets lists, and keys: the keys' type (H_KEYS)."""
        self.lists = False
        self.keys = 0
        kinds = []
        out = self._batches(epoch, kinds)
        # one type for the pass (torch passes each key as it is: a pass mixing types gets ints)
        self.keys = kinds[0] if kinds and kinds.count(kinds[0]) == len(kinds) else 0
        return out

    def _batches(self, epoch, kinds):
        if self.batch_sampler is not None:
            return [_keys(b, "batch_sampler", kinds)
                    for b in self.one_pass(self.batch_sampler, "batch_sampler")]
        bs = self.batch_size
        if bs is None and self.sampler is not None:
            items = list(self.one_pass(self.sampler, "sampler"))
            # each item a list of keys (torch's batched read: sampler=BatchSampler(...),
            # batch_size=None): one __getitem__ call with the list, as torch's (the workers
            # read H_LISTS); else each item is one key
            self.lists = lists = bool(items) and _is_key_list(items[0])
            if lists:
                for k in items:
                    if not _is_key_list(k):
                        raise TypeError("stoke: the sampler mixes lists of keys and single keys "
                                        "(%r): a stoke.DataLoader takes one or the other in an "
                                        "epoch" % (k,))
                return [_keys(k, kinds=kinds) for k in items]
            return [[i] for i in _keys(items, kinds=kinds)]
        order = self.sample_order(epoch, kinds)
        if self.sampler is None and bs is not None:
            return order, bs, self.drop_last
        order = list(order) if self.sampler is not None else order.tolist()
        if bs is None:
            return [[i] for i in order]
        out = [order[i:i + bs] for i in range(0, len(order), bs)]
        if out and self.drop_last and len(out[-1]) < bs:
            out.pop()
        return out

    def shuffle_drawn(self):
        """Whether shuffle=True draws its seed each pass (no seed= nor generator=)."""
        return self.shuffle and self.seed is None and self.sampler is None

    def shuffle_seed(self):
        """The seed of this pass's permutation (keyed by (seed, epoch)): seed=, else
        generator's initial seed, else drawn from torch's default generator, as torch's
        RandomSampler draws its seed at each pass (after the loader's base seed): so
        torch.manual_seed(s) sets the order, and the global RNG moves as torch's does."""
        s = self.seed
        if s is None:
            s, self.restore_seed = self.restore_seed, None
            if s is None:
                s = (int(torch.empty((), dtype=torch.int64).random_().item())
                     if torch is not None else random.getrandbits(63))
        self.epoch_seed = s
        return s

    def iterating(self):
        """A pass starts: persistent workers keep the base seed of the first one (torch
        seeds them and calls worker_init_fn once, and draws no base seed for later passes)."""
        if self.persistent and self.base_fixed is None:
            self.base_fixed = self.plan.base_seed()

    def static_order(self):
        """Whether the order comes from no sampler, or from one whose iteration has no state
        (a plain sequence of indices or of index lists)."""
        s = self.batch_sampler if self.batch_sampler is not None else self.sampler
        return s is None or _stateless(s)

    def plan_stale(self):
        """Whether the plan of an epoch's start not yet begun (written at construction, by
        set_epoch() or load_state_dict(), without a sampler) was of another dataset length
        than now's (samples appended since)."""
        return (not self.iterable and self.sampler is None and self.batch_sampler is None
                and self.planned_len is not None and len(self.dataset) != self.planned_len)

    def again(self):
        """Before the set_epoch hook plans the planned epoch again (plan_stale():
        DataLoader._plan_again): its base seed and its drawn shuffle seed are kept, nothing
        drawn again (batch 0 made at construction is dropped by the hook)."""
        self.base_again = self.plan.base_seed()
        if self.shuffle_drawn():
            self.restore_seed = self.epoch_seed

    def plan_now(self, epoch):
        """At the first iteration, when the creation's hook left the plan to it (defer): the
        sampler's order of now, under the base seed that hook drew."""
        self.plan.write(epoch, self.batches(epoch), self.plan.base_seed(), self.lists,
                        self.keys)
        self.planned = True
        self.pending = False
        if torch is not None:  # (a sampler drawing from the global RNG drew)
            self.rng_after = self.rng_state()

    def lazy_order(self):
        """Whether iter() leaves the sampler's read to the first next() (lazy): no worker
        (the batches are made in next()), a sampler object (one with state)."""
        return self.num_workers == 0 and not self.iterable and not self.static_order()

    def plan_pending(self):
        """The pass's first next(), when iter() left the plan to it (pending): the sampler is
        read now, as torch's single-process iterator reads it."""
        self.plan_now(int(self.plan.head[_Plan.H_EPOCH]))

    def first_batch(self):
        b = self.batches(0)
        return b[0][:b[1]].tolist() if isinstance(b, tuple) else b[0]

    def first_keys(self):
        """first_batch()'s keys as __getitem__ gets them (the sampler's type: measure()'s
        child, forked before any plan's H_KEYS)."""
        idx = self.first_batch()
        return _key_objs(idx, self.keys) if self.keys else idx

    def base_seed_for(self):
        if torch is not None:
            return int(torch.empty((), dtype=torch.int64).random_(generator=self.generator)
                       .item())
        return random.getrandbits(63)

    def rng_state(self):
        g = self.generator
        return g.get_state() if g is not None else torch.get_rng_state()

    def redraw(self):
        """Before the first iteration, when rng_moved(): the next set_epoch hook draws the base
        seed again; the epoch's batches are made again only when the sampler draws from the
        global RNG too (a sampler with a generator of its own was iterated already)."""
        s = self.batch_sampler if self.batch_sampler is not None else self.sampler
        s = getattr(s, "sampler", s)
        uses_global = (s is not None and getattr(s, "generator", False) is None) or (
            s is None and self.shuffle_drawn())  # (the shuffle draws its seed: shuffle_seed)
        self.reseed_only = not uses_global and self.planned and not self.plan_stale()

    def rng_moved(self):
        """Whether the RNG the base seed is drawn from changed since the last draw: torch draws
        it when iteration starts; a script that seeds after making the loader must see its
        seed's augmentations (the consumer then draws again, the workers reseed)."""
        if self.base_rng_moved:  # (replay_construction found it moved)
            return True
        if torch is None or self.rng_after is None:
            return False
        return not torch.equal(self.rng_after, self.rng_state())

    # -- hooks called by the C loader --

    def set_epoch(self, epoch, _unused=0):
        try:
            if self.worker == -2:
                # (after the construction: a set_epoch or a restore before the first
                # iteration drew from the RNGs as they are; nothing is replayed then)
                self.ctor_states = None
                self.base_rng_moved = False  # (this hook draws the base seed again)
                if self.preplanned and epoch == 0:  # the creation's: measure() planned epoch 0
                    self.preplanned = False
                    if torch is not None:
                        self.rng_after = self.rng_state()
                    return None
                self.preplanned = False
                if self.kept is not None:  # batch 0 of the plan measure() made is not wanted
                    self.drop_kept()
                if self.live:
                    # the loader abandoned the run (no fill is in progress: it waits for them
                    # before this hook): the batches made and never decoded never will be
                    self.live.clear()
                self.drop_spills()
                self.plan.mail_clear()
                self.kept_errors.clear()
                # (no worker makes a batch during this hook)
                self.ship_changes()
                self.refresh_rows()
                # persistent workers are seeded once: no new base seed (torch draws none)
                again = self.base_again is not None
                if self.pipe and not again:
                    # torch's iterator draws an IterDataPipe's shared seed at every pass,
                    # before the base seed (_share_dist_seed, from the generator)
                    self.plan.head[_Plan.H_PIPE] = (self.restore_pipe if self.restore_pipe
                                                    is not None else self.base_seed_for())
                fresh = self.base_fixed is None and not again  # (the workers start anew)
                seed, self.base_again = (
                    self.base_fixed if self.base_fixed is not None else
                    self.base_again if self.base_again is not None else self.base_seed_for(),
                    None)
                if self.pipe and fresh and self.num_workers > 0:
                    # (torch's worker iterator draws the shared seed once more as it starts,
                    # its _reset(first_iter=True): unused, but the generator moves)
                    self.base_seed_for()
                if not again:  # a new pass (persistent workers: pass_reseed)
                    # (left before its end: a pass no worker could make a batch of is not)
                    self.plan.head[_Plan.H_CUT] = self.workers_began and not self.pass_ended
                    self.plan.head[_Plan.H_PASS] += 1
                self.pass_ended = False
                # (a plan iter() left to the first next() is superseded by this one: the
                # sampler read once an epoch; the lazy branch below leaves it pending again)
                self.pending = False
                if self.iterable:
                    self.plan.head[_Plan.H_EPOCH] = epoch
                    self.plan.head[_Plan.H_SEED] = seed
                    self.plan.head[_Plan.H_RUN] += 1  # (the worker processes' iterators too)
                    with self.iter_lock:
                        self.iters.clear()
                        if self.pipe and not self.iter_map:  # (iterated in this process)
                            self.seed_pipe()
                elif self.reseed_only:  # epoch 0 again with a new seed, the same batches
                    self.reseed_only = False
                    self.plan.head[_Plan.H_SEED] = seed
                elif self.defer:  # the creation's: the first iteration reads the sampler
                    self.defer = False
                    self.planned = False
                    self.plan.head[_Plan.H_EPOCH] = epoch
                    self.plan.head[_Plan.H_SEED] = seed
                elif self.lazy and not again:  # iter()'s, num_workers=0: the first next() reads it
                    self.planned = False
                    self.pending = True
                    self.plan.head[_Plan.H_EPOCH] = epoch
                    self.plan.head[_Plan.H_SEED] = seed
                else:
                    # unplanned until the sampler's batches are written: after a sampler that
                    # raised, the next iter() runs this hook again (DataLoader.__iter__), never
                    # delivering the last epoch's batches as this one's
                    self.planned = False
                    if again:  # (the workers, made no batch of the new plan, see it with it)
                        self.plan.head[_Plan.H_AGAIN] += 1
                    self.plan.write(epoch, self.batches(epoch), seed, self.lists, self.keys)
                    self.planned = True
                if torch is not None:  # after the sampler's draws too
                    self.rng_after = self.rng_state()
            else:
                self.pass_reseed()
                if ((epoch, self.plan.base_seed(), int(self.plan.head[_Plan.H_AGAIN]))
                        != (self.seeded_epoch, self.seeded_base, self.seeded_again)):
                    self.start_worker_epoch(epoch)
            return None
        except Exception as e:  # noqa: BLE001 - reported through the loader
            self.keep_error(-1, e, None)
            return "%s: %s" % (type(e).__name__, e)
        except BaseException as e:  # noqa: BLE001 - Ctrl-C, sys.exit() in a sampler: itself
            return self.interrupted(e, None)

    def worker_init(self, worker, num_workers):
        if self.worker >= 0:  # a worker process, before its first batch
            try:
                self.start_worker_epoch(int(self.plan.head[_Plan.H_EPOCH]))
            except Exception as e:  # noqa: BLE001
                self.keep_error(-1, e, None, self.worker)
                return "worker_init_fn: %s: %s" % (type(e).__name__, e)
        return None

    def ship_changes(self):
        """The consumer's process, while no worker process starts a pass (before the first
        pass; a new pass's set_epoch hook): the dataset's attributes set or deleted here since
        the worker processes were forked, pickled for them; each sets them on its copy at its
        next pass's start (fresh_dataset), as torch's workers, forked at each iter() (at the
        first with persistent_workers), see them: a curriculum's dataset.scale = epoch, a
        dataset's own set_epoch.  What does not pickle is in `unsent`, with why."""
        if self.ds_ids is None or (self.persistent and self.started):
            return
        attrs = _attrs_of(self.dataset)  # (the datasets walked once a pass)
        if self.shipped is not None and not _attrs_changed(self.shipped, self.dataset, attrs):
            return  # (the patch shipped last still holds: not pickled again each pass)
        changed = _attrs_changed(self.ds_ids, self.dataset, attrs)
        # (a dataset replaced is sent whole, its attributes with it: the old one's are not
        # deleted from it, nor looked for in a list that is shorter now)
        replaced = set(changed)
        patch = {k: attrs.get(k, _Deleted) for k in changed if not _under(k, replaced)}
        unsent = {}
        try:
            data = pickle.dumps(patch, pickle.HIGHEST_PROTOCOL) if patch else b""
        except Exception:  # noqa: BLE001 - which ones, and why: each alone
            for k in list(patch):
                try:
                    pickle.dumps(patch[k], pickle.HIGHEST_PROTOCOL)
                except Exception as e:  # noqa: BLE001 - told by DataLoader._dataset_changed
                    unsent[k] = "%s: %s" % (type(e).__name__, e)
                    del patch[k]
            try:
                data = pickle.dumps(patch, pickle.HIGHEST_PROTOCOL) if patch else b""
            except Exception as e:  # noqa: BLE001 - pickled alone, not together
                unsent.update((k, "%s: %s" % (type(e).__name__, e)) for k in patch)
                data = b""
        self.plan.set_patch(data)
        self.unsent = unsent
        self.shipped = _attr_ids(self.dataset, attrs)

    def refresh_rows(self):
        """(a TensorDataset's rows) Its `tensors` set anew since the last pass (relabelling,
        pseudo-labels): served from this pass on, as torch indexes `dataset.tensors` at each
        sample (the tensors taken at construction were served: the old labels, silently), and
        of another length too (rows appended: each epoch has the batches of its length).  The
        same number, dtypes and row shapes, or a ValueError: the buffers were sized for them.
        With persistent workers, at the first pass only, as torch's."""
        if not self.rows_path or (self.persistent and self.started and self.worker == -2):
            return  # (torch's persistent workers keep the tensors of their first pass)
        ts, old = _tensor_rows(self.dataset), self.tensors
        if ts is not None and len(ts) == len(old) and all(a is b for a, b in zip(ts, old)):
            return
        if ts is None or len(ts) != len(old) or any(
                len(a) != len(ts[0]) or a.dtype != b.dtype or a.shape[1:] != b.shape[1:]
                for a, b in zip(ts, old)):
            raise ValueError(
                "stoke: the TensorDataset's tensors were replaced by ones of another number, "
                "dtype or row shape, or of lengths that differ, since this DataLoader was made "
                "(its buffers were sized for them): make a new DataLoader")
        self.tensors = ts
        self.plan.wrap = len(ts[0])  # (negative indices count from the new length)

    def apply_changes(self):
        """A worker process: the attributes the consumer shipped (ship_changes) set on its
        dataset (in its __dict__, as a fork would have them: no __setattr__ runs), and on the
        datasets in it ("dataset.scale": a Subset's dataset's), a dataset replaced before the
        attributes of the new one."""
        data = self.plan.patch()
        if not data:
            return
        for k, v in pickle.loads(data).items():
            obj, name = _owner(self.dataset, k)
            attrs = getattr(obj, "__dict__", None)
            if type(attrs) is not dict:
                continue
            if v is _Deleted:
                attrs.pop(name, None)
            else:
                attrs[name] = v

    def fork_child(self, worker):
        self.worker = worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle
        if worker >= 0:
            _one_intraop_thread()  # as torch's workers: one intra-op thread each

    def start_worker_epoch(self, epoch):
        """In a worker process, before its first batch of an epoch: torch's worker set-up
        (seeds, get_worker_info, worker_init_fn) once, or every epoch when the workers are not
        persistent (torch starts new ones each epoch)."""
        base = self.plan.base_seed()
        again = int(self.plan.head[_Plan.H_AGAIN])
        if (self.seeded_epoch is None or not self.persistent
                or (epoch == self.seeded_epoch and base != self.seeded_base)):
            if not self.persistent or self.seeded_epoch is None:
                self.fresh_dataset(self.seeded_epoch is None)
                self.refresh_rows()  # (a worker process's: its dataset's tensors, as sent)
            self.seeded_base = base
            seed = self.seed_rngs(base)
            if torch is not None:
                from torch.utils.data._utils import worker as tw
                tw._worker_info = tw.WorkerInfo(id=self.worker, num_workers=self.num_workers,
                                                seed=seed, dataset=self.dataset)
            if self.pipe:  # torch's _sharding_worker_init_fn: the ranks' workers, then init
                ws, rank = _dist_settings()
                _graph_settings().apply_sharding(self.dataset, self.num_workers * ws,
                                                 self.worker * ws + rank)
            if self.worker_init_fn is not None:
                self.worker_init_fn(self.worker)
            self.epoch_rngs = _rng_states() if self.persistent else None
            if self.cut_pending is not None:  # (pass_reseed)
                p, self.cut_pending = self.cut_pending, None
                self.reseed_for_pass(p)
        elif epoch != self.seeded_epoch:  # persistent workers: an epoch's RNGs at its start
            self.epoch_rngs = _rng_states()
        elif again != self.seeded_again and self.epoch_rngs is not None:
            # persistent workers, the epoch planned again (_Writer.again): their RNGs back at
            # the epoch's start, where torch's are at its pass (the old plan's batches drew)
            for j, st in enumerate(self.epoch_rngs):
                _set_rng(j, st)
        self.seeded_epoch = epoch
        self.seeded_again = again

    def seed_pipe(self):
        """An IterDataPipe's pass, as torch's DataLoader sets it up: its random pipes (a
        Shuffler) seeded from the pass's shared seed (H_PIPE), the same in every worker, so
        that a sharding_filter after a shuffle splits one order among them; iterated in the
        caller's process (no worker process), sharded by the distributed ranks (a worker
        process is sharded once it starts: start_worker_epoch)."""
        gs = _graph_settings()
        rng = torch.Generator()
        rng.manual_seed(int(self.plan.head[_Plan.H_PIPE]))
        gs.apply_random_seed(self.dataset, rng)
        if self.worker < 0:
            ws, rank = _dist_settings()
            gs.apply_sharding(self.dataset, ws, rank)

    def seed_rngs(self, base):
        """A worker process's global RNGs seeded as torch seeds its worker's: base + its id
        (NumPy's from torch's _generate_state(base, id)); the seed."""
        seed = base + self.worker
        random.seed(seed)
        if torch is not None:
            torch.manual_seed(seed)
            if np is not None:
                from torch.utils.data._utils import worker as tw
                np.random.seed(tw._generate_state(base, self.worker))
        elif np is not None:
            np.random.seed(seed & 0xFFFFFFFF)
        return seed

    def pass_reseed(self):
        """A persistent worker process at a new pass (H_PASS) whose last one was left before
        its end (H_CUT: a break, set_epoch() of the pass again, ...): its RNGs were as far as
        the batches it made, which depends on timing (torch's finish the batches sent, a
        count stoke's abandoned run does not keep).  They are seeded from the base seed, the
        worker and the pass's number instead: the same draws on every run of the script,
        fresh ones each pass.  After a pass that ended, the RNGs go on as torch's.  So is a
        worker that made nothing of the pass left (a process still starting when it was): it
        is seeded first as at any start (start_worker_epoch: its worker_init_fn too), then
        for this pass, as if it had made its share."""
        p = int(self.plan.head[_Plan.H_PASS])
        if p == self.seen_pass:
            return
        self.seen_pass = p
        if not (self.persistent and self.plan.head[_Plan.H_CUT]):
            return
        if self.seeded_epoch is None:
            self.cut_pending = p  # (start_worker_epoch, after its seeding)
            return
        self.reseed_for_pass(p)

    def reseed_for_pass(self, p):
        mix = hashlib.blake2b(struct.pack("<qqq", self.seeded_base, self.worker, p),
                              digest_size=8, person=b"stoke-pass").digest()
        self.seed_rngs(int.from_bytes(mix, "little") >> 1)
        self.epoch_rngs = _rng_states()

    def fresh_dataset(self, first):
        """A worker process's pass without persistent workers: torch's workers are new
        processes each pass, each with the dataset as the caller's, so what worker_init_fn or
        __iter__ set on a worker's dataset before is gone (torch's sharding example narrows
        dataset.start/end in worker_init_fn: narrowed again, pass 2 lost half of the samples
        and pass 3 more).  The first pass keeps the dataset's attributes (a shallow copy of its
        __dict__: the dataset itself is not copied, which for an array or a memmap would copy
        its data, and for a list touch every element's page), and those of the datasets in it
        (_watched); each later one sets them back (objects changed in place stay changed; a
        dataset without a __dict__ has none set).
        Then, at every pass (the first alone with persistent workers), the attributes the
        consumer set since the fork (apply_changes): the dataset as torch's new worker has it."""
        if type(getattr(self.dataset, "__dict__", None)) is not dict:
            return
        if first:
            self.dataset0 = [(obj, dict(obj.__dict__)) for _, obj in _watched(self.dataset)
                             if type(getattr(obj, "__dict__", None)) is dict]
        else:
            for obj, attrs in self.dataset0:
                obj.__dict__.clear()
                obj.__dict__.update(attrs)
            with self.iter_lock:
                self.iters.clear()
        self.apply_changes()

    # -- making a batch --

    def fetch(self, indices, where, block=None):
        if self.rows_path:
            return None
        gone = _stoke._abandoned  # asked before each sample: a batch nobody wants stops there
        ds, wk = self.dataset, self.worker
        cur = self.plan.cur_mv if wk >= 0 else None  # a worker that dies names its sample
        code = self.plan.head[_Plan.H_KEYS]
        if code:  # the sampler's keys were NumPy scalars or tensors: __getitem__ gets those
            indices = _key_objs(indices, int(code))
        if self.keyed and self.plan.head[_Plan.H_LISTS]:
            # batch_size=None, the sampler's item a list of keys: __getitem__ takes the list
            where[0] = indices[0] if indices else None
            out = [ds[list(indices)]]
        elif self.getitems is not None:
            out = self.getitems(indices)  # (one call: not cut)
        elif self.rows and block is not None:
            out = []
            outs = {}  # path: the batch's tensor
            n = len(indices)
            for k, j in enumerate(indices):
                if gone():
                    raise _Abandoned()
                where[0] = j
                if cur is not None:
                    cur[wk] = j
                out.append(self.row(block, outs, ds[j], "", k, n))
        elif cur is not None:
            out = []
            for j in indices:
                if gone():
                    raise _Abandoned()
                where[0] = cur[wk] = j
                out.append(ds[j])
        else:
            out = []
            for j in indices:
                if gone():
                    raise _Abandoned()
                where[0] = j
                out.append(ds[j])
        if gone():  # (nor collated)
            raise _Abandoned()
        where[0] = None  # collate's errors are the batch's, not its last sample's
        return out

    def row(self, block, outs, x, path, k, n):
        """Sample k with its tensor leaves copied into row k of the batch's tensors in the
        block (made at k == 0) and replaced by _Row marks, so that a worker holds one sample's
        tensors at a time, not the batch's twice (measure() turns this on for big samples of
        fixed shapes).  A leaf that does not fit its row (another shape or dtype than sample
        0's) stays as it is: collate then stacks the column as torch would, or raises its
        error.  Containers are made again with their own type; one that cannot be is kept."""
        if type(x) is torch.Tensor:
            out = outs.get(path) if k else None
            if k == 0 and x.layout == torch.strided and x.device.type == "cpu":
                try:
                    out = outs[path] = block.tensor(x.dtype, (n,) + tuple(x.shape))
                except _Overflow:  # (the batch outgrows the block: the column is stacked
                    outs[path] = None  # by collate, which overflows, and the batch spills
                    return x           # with its samples, not fetched again)
            if (out is None or out.dtype != x.dtype or out.shape[1:] != x.shape
                    or x.layout != torch.strided or x.device.type != "cpu" or x.requires_grad):
                return x  # collate stacks this column as torch would, or raises its error
            out[k].copy_(x)
            return _Row(out, k)
        try:
            if isinstance(x, _abc.Mapping):
                return type(x)({key: self.row(block, outs, v, path + "." + str(key), k, n)
                                for key, v in x.items()})
            if _is_namedtuple(x):
                return type(x)(*(self.row(block, outs, v, _sub(path, i), k, n)
                                 for i, v in enumerate(x)))
            if isinstance(x, (tuple, list)):
                return type(x)(self.row(block, outs, v, _sub(path, i), k, n) for i, v in enumerate(x))
        except TypeError:  # a container that its type cannot make from our items
            pass
        return x

    def write(self, block, samples, indices):
        if self.rows_path:  # rows of in-memory tensors
            idx = torch.as_tensor(indices, dtype=torch.int64)
            outs = []
            for t in self.tensors:
                o = block.tensor(t.dtype, (len(indices),) + tuple(t.shape[1:]))
                try:
                    torch.index_select(t, 0, idx, out=o)
                except RuntimeError as e:
                    err = _grad_error(e, (t,))
                    if err is None:
                        raise
                    raise err from e
                outs.append(o)
            return block.finish(outs)
        if self.collate_fn is not None:
            return _finish_keeping(block, self.collate(samples))
        if self.batch_size is None and self.batch_sampler is None:
            return _finish_keeping(block, _convert(samples[0]))
        return block.finish(self.collator(block, samples), samples=samples)

    def fill(self, i, worker, view):
        if not self.processes and self.num_workers > 1 and not self.rows_path:
            # Worker threads share the interpreter's globals (RNGs): one batch at a time, so
            # that a dataset reseeding a global RNG per item delivers exactly ds[i].
            with self.fill_lock:
                return self.fill_one(i, worker, view)
        return self.fill_one(i, worker, view)

    def fill_one(self, i, worker, view):
        if self.worker >= 0:
            self.pass_reseed()
        if (self.worker >= 0 and self.seeded_epoch is not None
                and (int(self.plan.head[_Plan.H_SEED]) != self.seeded_base
                     or int(self.plan.head[_Plan.H_AGAIN]) != self.seeded_again)
                and int(self.plan.head[_Plan.H_EPOCH]) == self.seeded_epoch):
            # the epoch restarted with a new seed, or planned again (as torch's new workers
            # of the pass at iter(): the dataset as sent then, the seeds from their start)
            self.start_worker_epoch(self.seeded_epoch)
        if self.iter_map:
            run = int(self.plan.head[_Plan.H_RUN])
            if run != self.iter_run:  # a new run (the same epoch and seed again included)
                self.iter_run = run
                self.iters.clear()
                if self.pipe:
                    self.seed_pipe()
                # a process that replaced a dead one mid-run: the share's iterator died with
                # it, and iterating it again from its start would repeat its samples (one
                # that died after its share ended: the share stays ended)
                self.iter_at = (self.plan.began(self.worker, run) if self.worker >= 0
                                else _Plan.ITER_FRESH)
            if self.iter_at == _Plan.ITER_LOST:
                return (_ITER_LOST % (self.worker,) + _INTERRUPTED_END).encode()
            r = 0 if self.iter_at == _Plan.ITER_DONE else self.next_fill(worker, view, i)
            if r == 0:  # (its error mailed under batch i, by next_fill)
                if self.worker >= 0:
                    self.plan.exhausted(self.worker, run)
                struct.pack_into("<QQ", view, 0, MAGIC_END, self.worker)
                return 16
            return r[0] if isinstance(r, tuple) else r
        if i >= self.plan.head[_Plan.H_NBATCH]:  # past the epoch's batches: its end
            struct.pack_into("<QQ", view, 0, MAGIC_END, worker)
            return 16
        if self.kept is not None:
            k, self.kept = self.kept, None
            if i == 0 and int(self.plan.head[_Plan.H_EPOCH]) == 0:
                return self.fill_kept(k, i, worker, view)
            self.live.pop(k.token, None)
        where = [None]
        indices = samples = None
        try:
            indices = self.plan.batch(i).tolist()
            block = _Block(view, self.live, self.fast)
            samples = self.fetch(indices, where, block)
            return self.write(block, samples, indices)
        except _Overflow as o:  # (from write: fetch's rows stop streaming when the block is full)
            block = None
            return self.spill_or_fail(i, worker, view, o, where,
                                      lambda blk: self.write(blk, samples, indices))
        except _Abandoned:
            return "its run was abandoned"  # (pyw_get: STOKE_ECANCELED)
        except Exception as e:  # noqa: BLE001 - the consumer re-raises it
            return self.fail(i, worker, e, where[0])
        except BaseException as e:  # noqa: BLE001 - Ctrl-C, sys.exit(): never a bad sample
            return self.interrupted(e, where[0])

    def fill_kept(self, k, i, worker, view):
        """Batch 0 as measure() made it (its bytes copied into the slot; its structure stays
        kept under the same token), or its failure raised as it would be now."""
        if k.error is not None:
            # taken out of k: k -> error -> its traceback -> measure_here's frame -> k was a
            # cycle, and the traceback holds batch 0's probe block (_probe_block's frame)
            err, k.error = k.error, None
            try:
                raise err
            except Exception as e:  # noqa: BLE001 - the consumer re-raises it
                return self.fail(i, worker, e, k.index)
            finally:
                err = None  # (err -> traceback -> this frame -> err)
        if k.used > len(view):  # (max_batch_bytes is not measured: cannot happen)
            return self.keep_spill(view, k.block.view, k.used)  # (its own mapping already)
        view[:k.used] = k.block.view[:k.used]
        return k.used

    def spill(self, view, over, make):
        """A batch that outgrew its block (over: the _Overflow), made again in memory of its
        own, sized from what it needed (doubled until it fits), and sent as a MAGIC_SPILL
        header in the block: torch's workers make a batch of any size.  The samples are not
        fetched again (they were, in the caller's process, outside the workers: each twice,
        get_worker_info() None there), nor the collate_fn's output made again (over.out).  A
        worker process's is a memfd sent to the consumer over the socket pair (SCM_RIGHTS: in
        flight, it outlives this process) and closed here; one of this process's own, a
        private mapping handed over in self.spills."""
        if over.out is not _NOTHING:
            out = over.out
            make = lambda blk: blk.finish(out, True)  # noqa: E731
        size = _align(over.need) * 2 + (1 << 20)
        if self.worker < 0:  # (decoded in this process)
            used, block = _probe_block(make, self.live, size)
            return self.keep_spill(view, block.view, used)
        while True:
            fd = os.memfd_create("stoke-batch", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                used = make(_Block(memoryview(mmap.mmap(fd, size)), self.live, self.fast))
                seq = self.next_spill()
                self.send_spill(fd, seq)
            except _Overflow as o:
                size = _align(o.need) * 2
                continue
            finally:
                os.close(fd)
            break
        return self.spill_header(view, used, seq)

    def next_spill(self):
        with self.spill_lock:
            self.spill_seq += 1
            return self.spill_seq

    def spill_header(self, view, used, seq):
        _SPILL.pack_into(view, 0, MAGIC_SPILL, os.getpid(), used, seq,
                         self.worker % max(len(self.spill_socks), 1))
        return _SPILL.size

    def keep_spill(self, view, mem, used):
        """A batch made in this process outside its block (mem), handed over in self.spills."""
        seq = self.next_spill()
        with self.spill_lock:
            self.spills[(os.getpid(), seq)] = mem
        return self.spill_header(view, used, seq)

    def send_spill(self, fd, seq):
        """fd to the consumer, on this worker's socket; its queue full (the send buffer's
        bytes: ~280 memfds of batches made and not yet read), again every millisecond until the
        consumer reads one, which it does as it reaches this worker's earlier batches, or
        until the batch is not wanted any more (the consumer waits for this fill to end the
        pass)."""
        msg = _SPILL_MSG.pack(os.getpid(), seq)
        tx = self.spill_socks[self.worker % len(self.spill_socks)][1]
        while True:
            try:
                socket.send_fds(tx, [msg], [fd])
                return
            except BlockingIOError:
                if _stoke._abandoned():
                    raise _Abandoned() from None
                time.sleep(0.001)

    def recv_spill(self, key, worker):
        """The consumer: the memfd of spill key (pid, seq), from worker's socket (any before
        it, of a batch not decoded, kept in self.spills); None if it never came."""
        if not 0 <= worker < len(self.spill_socks):
            return None
        rx = self.spill_socks[worker][0]
        with self.spill_lock:
            while key not in self.spills:
                try:
                    msg, fds, _, _ = socket.recv_fds(rx, _SPILL_MSG.size, 1)
                except BlockingIOError:
                    return None
                if fds:
                    self.spills[_SPILL_MSG.unpack(msg)] = fds[0]
            return self.spills.pop(key)

    def drop_spills(self):
        """At a pass's start (no fill runs): the spills of batches never decoded."""
        with self.spill_lock:
            for v in self.spills.values():
                if type(v) is int:
                    os.close(v)
            self.spills.clear()
            for rx, _ in self.spill_socks:
                while True:
                    try:
                        _, fds, _, _ = socket.recv_fds(rx, _SPILL_MSG.size, 1)
                    except BlockingIOError:
                        break
                    for fd in fds:
                        os.close(fd)

    def spill_or_fail(self, i, worker, view, over, where, make):
        """spill(), its failures answered as a fill's."""
        try:
            return self.spill(view, over, make)
        except _Abandoned:
            return "its run was abandoned"
        except Exception as e:  # noqa: BLE001 - the consumer re-raises it
            return self.fail(i, worker, e, where[0])
        except BaseException as e:  # noqa: BLE001 - Ctrl-C, sys.exit(): never a bad sample
            return self.interrupted(e, where[0])

    def next_samples(self, key):
        """The next batch's samples from iterator `key` (this worker's own copy of the dataset
        iterated; threads share key 0), [] at its end or, with drop_last, at a short batch.
        A batch nobody wants any more stops before its next sample and is not collated
        (_Abandoned): the samples it took are lost with the iterator, which the next run
        makes again (set_epoch's hook in this process; in a worker process, fill_one when
        the plan's H_RUN moved)."""
        gone = _stoke._abandoned
        with self.iter_lock:
            it = self.iters.get(key)
            if it is None:
                it = self.iters[key] = iter(self.dataset)
            samples = []
            n = self.batch_size or 1
            while len(samples) < n and not gone():
                s = next(it, _END)
                if s is _END:
                    break
                samples.append(s)
        if gone():
            raise _Abandoned()
        return [] if self.drop_last and len(samples) < n else samples

    def write_samples(self, block, samples):
        """An iterable's batch into the block: collate_fn, default_convert or default_collate."""
        if self.collate_fn is not None:
            return _finish_keeping(block, self.collate(samples))
        if self.batch_size is None:
            return _finish_keeping(block, _convert(samples[0]))
        return block.finish(self.collator(block, samples), samples=samples)

    def collate(self, samples):
        """The user's collate_fn on the batch's samples; without automatic batching
        (batch_size=None, no batch_sampler) on its one sample, as torch calls it."""
        if self.batch_size is None and self.batch_sampler is None:
            return self.collate_fn(samples[0])
        return self.collate_fn(samples)

    def next_fill(self, worker, view, i=-1):
        key = worker if self.worker >= 0 else 0  # threads share one iterator: each sample once
        samples = None
        try:
            samples = self.next_samples(key)
            if not samples:
                return 0
            return (self.write_samples(_Block(view, self.live, self.fast), samples), 0)
        except _Abandoned:
            return "its run was abandoned"  # (pyw_get, pyw_next: STOKE_ECANCELED)
        except _Overflow as o:
            r = self.spill_or_fail(i, worker, view, o, [None],
                                   lambda blk: self.write_samples(blk, samples))
            return (r, 0) if isinstance(r, int) else r
        except Exception as e:  # noqa: BLE001
            return self.fail(i, worker, e, None)
        except BaseException as e:  # noqa: BLE001 - Ctrl-C, sys.exit(): never a bad sample
            return self.interrupted(e, None)

    def interrupted(self, e, index):
        """A KeyboardInterrupt, SystemExit or GeneratorExit (a BaseException that is not an
        Exception) raised by the dataset or collate_fn: not a bad sample (on_error does not
        skip or replace it; bytes are pyw_get's status for that), it ends the epoch.  Raised in
        this process (num_workers=0, worker threads), the caller re-raises it as it is
        (DataLoader._batches), as torch's loop does; in a worker process it is the loader's
        error, as a torch worker's exit is a RuntimeError."""
        if self.worker < 0:
            self.interrupt = e
        what = "%s%s raised by the dataset" % (type(e).__name__, "(%s)" % e if str(e) else "")
        if index is not None:
            what += " (dataset index %d)" % index
        return (what + _INTERRUPTED_END).encode()

    def take_interrupt(self):
        e, self.interrupt = self.interrupt, None
        return e

    def fail(self, i, worker, e, index):
        if index is not None:  # (a sampler's NumPy or tensor key: _key_objs)
            index = operator.index(index)
        self.keep_error(i, e, index, worker)
        what = "%s: %s" % (type(e).__name__, e)
        return what if index is None else "%s (dataset index %d)" % (what, index)

    def keep_error(self, i, e, index, worker=0):
        tb = full = traceback.format_exc()
        if len(tb) > MAIL_ENTRY // 2:
            tb = "...\n" + tb[-(MAIL_ENTRY // 2):]
        try:
            payload = pickle.dumps((e, tb, index, os.getpid(), worker))
            pickle.loads(payload)  # an __init__ with other arguments than args fails here
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            payload = b""
        if (not payload or len(payload) > MAIL_ENTRY - 16) and self.worker < 0:
            # made in this process, and too long for a mailbox (a long message) or not to be
            # pickled (an __init__ with other arguments: a RuntimeError with its text, where
            # torch's num_workers=0 raises it as it is): the exception itself is kept for the
            # consumer (without its traceback, whose frames hold the batch's block; its text
            # goes in the note as for any other), its type unchanged
            token = next(_tokens)
            self.kept_errors[token] = e.with_traceback(None)
            payload = pickle.dumps((_KeptError(token), tb, index, os.getpid(), worker))
        elif not payload or len(payload) > MAIL_ENTRY - 16:
            # a worker process's, too long or not to be pickled (an attribute holding a lock or
            # a file, an __init__ with other arguments): made again in the consumer's process
            # from its type and torch's message (_Rebuild), as torch's ExceptionWrapper
            # rebuilds every worker's (`except ValueError` still catches it); a long
            # traceback keeps its last frames and its exception line's start
            text = full
            if len(text) > MAIL_ENTRY // 4:
                only = "".join(traceback.format_exception_only(type(e), e))
                head = text[:-len(only)] if text.endswith(only) else text
                if len(only) > MAIL_ENTRY // 8:
                    only = only[:MAIL_ENTRY // 8] + " ... (message cut by stoke)\n"
                text = "...\n" + head[-(MAIL_ENTRY // 8):] + only
            msg = "Caught %s in DataLoader worker process %d.\nOriginal %s" % (
                type(e).__name__, worker, text)
            try:
                payload = pickle.dumps((_Rebuild(type(e), msg), tb, index, os.getpid(), worker))
                pickle.loads(payload)
            except Exception:  # noqa: BLE001 - a class pickle cannot name (made in a function)
                payload = pickle.dumps((_Rebuild(RuntimeError, msg), tb, index, os.getpid(),
                                        worker))
        if not payload or len(payload) > MAIL_ENTRY - 16:
            text = ("%s: %s" % (type(e).__name__, e))[:MAIL_ENTRY // 4]
            payload = pickle.dumps((RuntimeError(text), tb, index, os.getpid(), worker))
        self.plan.mail_put(worker if worker >= 0 else 0, i, payload)

    # -- the consumer's side --

    def measure(self, max_batch_bytes, meanwhile=None):
        if max_batch_bytes:
            self.blob_bytes = int(max_batch_bytes)
            return
        if not self.iterable and self.count()[0] == 0:  # no batch to measure, none to hold
            self.blob_bytes = 4096
            return
        if self.rows_path:
            bs = self.batch_size or 1  # rows of in-memory tensors: the size is known
            need = HDR + sum(_align(bs * t[0].numel() * t.element_size()) for t in self.tensors)
            self.blob_bytes = (need + (64 << 10) + 4095) & ~4095
            return
        if self.iterable or (self.num_workers == 0 and self.defer):
            # Not measured: an IterableDataset's first batch made in a child is lost to the
            # caller where its source is shared (a queue, a file object opened in __init__) and
            # blocks while that source is empty; without workers a map dataset would be called
            # in a forked child (its LMDB or sqlite handle).  Larger batches spill (spill()).
            self.blob_bytes = _UNMEASURED_BYTES
            return
        if self.num_workers == 0:
            need = self.measure_here()
            if meanwhile is not None:
                try:
                    meanwhile()
                except Exception:  # noqa: BLE001 - the loader's creation reports it again
                    pass
        else:
            need, self.probe_pid = _probe(self, meanwhile)
        if need < 0:  # exact: fixed shapes under default_collate
            need = -need
            # big samples (images): each one's tensors go to their rows as it comes
            self.rows = torch is not None and need >= _ROW_BYTES * (self.batch_size or 1)
            self.blob_bytes = (need + need // 4 + (64 << 10) + 4095) & ~4095
        else:
            self.blob_bytes = max(4096, (need * 2 + (256 << 10) + 4095) & ~4095)

    def grow(self, buffers):
        """An unmeasured IterableDataset's blocks, where worker processes write them and no
        arena holds them: each block is address space of a shared memfd whose pages exist
        only once written, so a block may as well be large.  A batch over 8 MiB (images) is
        then written in place, not spilled (a memfd of its own, received and mapped here: 5.5
        times slower at 38 MB batches), and a small one costs what it writes, as before.
        Where an accelerator pins them, each block is pinned as far as its batches use it
        (the C loader's pin_on_use: pinned()), not whole: a backend pins every page of what
        it registers.  `buffers`: about how many blocks the loader will have; their
        address space is kept to a quarter of physical memory (the loader refuses buffers that
        exceed it)."""
        try:
            phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return
        size = min(_SPARSE_BYTES, phys // (4 * max(1, buffers))) & ~4095
        if size > self.blob_bytes:
            self.blob_bytes = size
            self.sparse = True

    def reap_probe(self):
        """Reaps measure()'s child (_probe), which answered before its exit: the loader's
        creation ran meanwhile instead of waiting for that exit (the unmapping of a forked
        interpreter with torch: ~8 ms)."""
        pid, self.probe_pid = self.probe_pid, None
        if pid is not None:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:  # reaped by someone else (a SIGCHLD handler, os.wait())
                pass

    def measure_here(self):
        """measure() without workers: batch 0 made here, now, and kept for the first fill (no
        child, no sample fetched twice).  First what the loader's creation does next in its
        set_epoch hook (the base seed's draw, the sampler's iteration: the hook then keeps
        them), so that __getitem__ and collate_fn draw from the RNGs where they would in
        torch's first next().  Returns the bytes as _probe does."""
        try:
            seed = self.base_seed_for()
            self.plan.write(0, self.batches(0), seed, self.lists, self.keys)
        except Exception:  # noqa: BLE001 - the hook meets it again and reports it
            return _PROBE_FALLBACK
        self.preplanned = True
        k = _Kept(_rng_states())
        indices = self.plan.batch(0).tolist()
        where = [None]
        try:
            samples = self.fetch(indices, where)
            if self.collate_fn is not None:  # called once, however many blocks it takes
                out = self.collate(samples)
                k.used, k.block = _probe_block(lambda blk: blk.finish(out, True), self.live)
            else:
                k.used, k.block = _probe_block(lambda blk: self.write(blk, samples, indices),
                                               self.live)
        except Exception as e:  # noqa: BLE001 - the first fill raises it, as torch's next()
            k.error, k.index = e, where[0]
        k.after = _rng_states()
        k.attrs = _attr_ids(self.dataset)
        if k.block is not None and struct.unpack_from("<Q", k.block.view, 0)[0] == MAGIC_LIVE:
            k.token = struct.unpack_from("<Q", k.block.view, 8)[0]
        self.kept = k
        if k.error is not None:
            return _PROBE_FALLBACK
        if (self.collate_fn is None and not self.collator.pad and self.batch_size
                and self.getitems is None):
            return -(k.used + k.block.pickled)  # exact (a pickle's worth of margin)
        return k.used

    def replay_construction(self):
        """At the first iteration, before first_iteration(): the construction's draws (the
        base seed, the sampler's order, batch 0's making) are made now, where torch's
        iterator makes them: each RNG nobody moved since the construction set them back is
        set to where they left it.  One that moved keeps its state (batch 0 made at
        construction is then dropped, and what drew from it draws again)."""
        c, self.ctor_states = self.ctor_states, None
        if c is None:
            return
        before, after = c
        for j, (now, b, a) in enumerate(zip(_ctor_states(self.generator), before, after)):
            if _same_rng(now, b):
                _set_ctor_state(j, a, self.generator)
                self.replayed += (j,) if j < 3 else ()
            else:
                # moved: what drew from it draws again (its state is not compared with the
                # construction's after it: a model's initialization that drew as many values
                # as the construction left it equal, and batch 0 of the construction's draws
                # was delivered)
                self.ctor_moved = True
                if j == (3 if self.generator is not None else 0):
                    self.base_rng_moved = True

    def first_iteration(self):
        """At the first iteration, after replay_construction(): batch 0 made at construction
        is delivered only if no RNG moved since (a script that seeds or makes its model after
        making the loader gets the batch 0 of its RNGs' state: also where batch 0's making
        drew from none of them, as a dataset drawing from a generator of its own that the
        script reseeds, or keyed by torch.initial_seed()) and no attribute of the dataset was
        set since (dataset.transform = ... after the loader was made: batch 0 had the old one,
        batches 1.. the new)."""
        k = self.kept
        if k is None:
            return
        changed = k.attrs is not None and _attrs_changed(k.attrs, self.dataset)
        if changed or self.ctor_moved:
            self.drop_kept()

    def drop_kept(self):
        """Batch 0 made at construction is not delivered: each RNG the first iteration set to
        where its making left it (replay_construction) goes back to where it was before that
        making (the batch made again draws as torch's first next() would); the others were
        never moved by it (the construction set them back)."""
        k, self.kept = self.kept, None
        self.live.pop(k.token, None)
        k.error = None  # (a cycle through its traceback: fill_kept)
        moved = self.rng_moved()
        replayed, self.replayed = self.replayed, ()
        now = _rng_states()
        for j in replayed:
            if _same_rng(now[j], k.after[j]):
                _set_rng(j, k.before[j])
        if torch is not None and not moved:
            self.rng_after = self.rng_state()

    def decode(self, b):
        if len(b) == 0:  # its one sample (this batch) skipped under on_error
            return _Skipped
        view = memoryview(b[0]).cast("B")
        head = _HEAD(view, 0)
        magic, a = head[0], head[1]
        if magic == MAGIC_END:
            return _End(a)
        if magic == MAGIC_SPILL:
            self.data_bytes += head[2]
            return self.take_spill(b, view)
        if magic != MAGIC_FAST and magic != MAGIC and magic != MAGIC_LIVE:
            raise RuntimeError("stoke: batch %d's block holds no batch (magic %#x)"
                               % (int(np.asarray(b.indices)[0]), magic))
        used = head[2] if magic == MAGIC_LIVE else a + head[2]
        self.data_bytes += used
        return self.load(view, self.pinned(b, used), head)

    def pinned(self, b, used):
        """Whether batch b is pinned: where its block is pinned as used (pin_lazy: an
        IterableDataset's large blocks where an accelerator pins them, grow()), its first
        `used` bytes are pinned now if an earlier batch of the block did not need as many
        (stoke_batch_pin; one warning, with the backend's reason, when that fails: the batch
        is then ordinary memory)."""
        if not self.pin_lazy or b.is_pinned:
            return b.is_pinned
        why = b._pin(used)
        if why is not None and not self.warned_pin:
            self.warned_pin = True
            warnings.warn("stoke: a batch's block could not be pinned (%s): such batches are "
                          "in ordinary memory" % why, RuntimeWarning, stacklevel=5)
        return why is None

    def load(self, view, pinned, head=None):
        """The batch in a block (view; head: its header, if read already): its skeleton's
        compiled builder run on its table (MAGIC_FAST), its structure unpickled, or the one
        this process kept (MAGIC_LIVE), each tensor its own bytes of the block (_leaf_tensor:
        its storage holds the view, which holds the batch)."""
        magic, a, n, toff, entries = head or _HEAD(view, 0)
        if magic == MAGIC_FAST:
            out = self.builders.get(view, a, n)(view, toff)
        else:
            if magic == MAGIC_LIVE:
                shape = self.live.pop(a, _End) if self.live is not None else _End
                if shape is _End:  # (a collate_fn may return None)
                    raise RuntimeError("stoke: a batch's structure is not kept in this process "
                                       "(token %d)" % a)
                out = _load_live(shape, view)
            else:
                out = _BlockUnpickler(io.BytesIO(view[a:a + n]), view).load()
                if torch is not None and getattr(torch._utils, "_sparse_tensors_to_validate",
                                                 None):
                    # as torch.load: a sparse tensor's unpickling keeps it in a list until it
                    # is validated, and with it the batch's block (every batch that held one)
                    torch._utils._validate_loaded_sparse_tensors()
        if self.pin and pinned and (self.collate_fn is not None or (
                magic != MAGIC_FAST and not self.collator.pad)):
            # torch pins every batch (its pin_memory()): a collate_fn's output, and the built-in
            # collation's too -- a str column of tuple samples (zip's tuple) becomes a list,
            # an object of a batch_size=None sample has its pin_memory() called.  A skeleton
            # (MAGIC_FAST) of the built-in collation holds no tuple nor object: nothing to do;
            # pad='s (padded, lengths) pairs are stoke's own, kept
            out = _pin_custom(out)
        return out

    def decode_copy(self, b):
        """decode(), into memory of the batch's own (pinned from stoke's pool when it can, else
        ordinary, with one warning), so that the loader gets its buffer back: the caller holds
        every other one (list(loader), the last N batches, or a part of each: the labels).
        Each tensor or array of a structure of tuples, lists and dicts gets a copy of its own,
        so that a part kept keeps only itself (the block copied whole, a loop keeping each
        batch's labels kept every batch: 176 MiB for 60 labels of 4); anything else (a custom
        batch class) a copy of the whole block."""
        if len(b) == 0:
            return _Skipped
        view = memoryview(b[0]).cast("B")
        head = _HEAD(view, 0)
        magic, a, n = head[0], head[1], head[2]
        local = False
        if magic == MAGIC_LIVE:
            # (a structure pickled by reference to this process's classes: copied whole, as
            # its types are any)
            local = self.live is not None and type(self.live.get(a)) is _Local
            a = 0  # n: the data's end
        elif magic != MAGIC and magic != MAGIC_FAST:  # (MAGIC_FAST: the skeleton is last)
            return self.decode(b)
        self.data_bytes += a + n
        # (its copy is pinned memory of its own; the block is pinned as in decode(), where
        # the next batches need it, so that the batch counts as the pinned one it is)
        pin = self.pinned(b, a + n) or self.pin_lazy
        if self.collate_fn is None and not local:  # (a collate_fn's: copied whole)
            out = self.load(view, pin, head)
            leaves = _LeafBuffers(self, pin, _small_bytes(out))
            copied = _copy_leaves(out, leaves.get)
            if copied is not _NOT_LEAVES and leaves.pinned is not None:
                # (no buffer: nothing copied, no tensor of the batch's -- strings, numbers)
                self.recount(b, leaves.pinned)
            if copied is not _NOT_LEAVES or magic == MAGIC_LIVE:
                # (a structure kept in this process loads once: never anything _copy_leaves
                # refuses, as _load_live makes the same types; it would keep its block)
                return out if copied is _NOT_LEAVES else copied
            out = None
        # (a batch that is not pinned: no accelerator, pin_memory=False; its copy is ordinary
        # memory without a word from the pinned pool, which would warn that it cannot pin)
        buf = self._held_buffer(a + n, pin)
        dst = memoryview(buf).cast("B")
        dst[:a + n] = view[:a + n]
        self.recount(b, buf.pinned)
        return self.load(dst, buf.pinned, head)

    def recount(self, b, pinned):
        """Batch b's tensors were copied into memory of their own, pinned or not: stats()
        counts the batch so (the C loader counted it as its block)."""
        self.pin_delta += int(bool(pinned)) - int(bool(b.is_pinned))

    def _held_buffer(self, nbytes, pin):
        buf = _stoke.PinnedBuffer(max(nbytes, 1), pin=pin)
        if not buf.pinned and pin and not self.warned_copy:
            self.warned_copy = True
            warnings.warn("stoke: the batches held exceed the pinned memory stoke may use: "
                          "further held batches are in ordinary memory", RuntimeWarning,
                          stacklevel=4)
        return buf

    def take_spill(self, b, view):
        """A batch its worker made in memory of its own (spill): its memfd received and mapped
        (private), or this process's own taken; copied into pinned memory when the loader pins
        (one warning naming the max_batch_bytes that keeps batches in their blocks)."""
        _, pid, used, seq, worker = _SPILL.unpack_from(view, 0)
        i = int(np.asarray(b.indices)[0])
        pin = bool(b.is_pinned) or self.pin_lazy
        if not self.warned_over:
            self.warned_over = True
            warnings.warn("stoke: batch %d needs %d bytes, more than a block (%d): such batches "
                          "are made by their worker in memory of their own%s; pass "
                          "max_batch_bytes=%d to keep them in the blocks"
                          % (i, used, self.blob_bytes, " and copied into pinned memory here"
                             if pin else "", 2 * used), RuntimeWarning, stacklevel=5)
        if pid == os.getpid():
            with self.spill_lock:
                src = self.spills.pop((pid, seq))
        else:
            fd = self.recv_spill((pid, seq), worker)
            if fd is None:
                raise RuntimeError("stoke: batch %d outgrew its block and its memory never "
                                   "came from its worker process (pid %d)" % (i, pid))
            src = _map_spill(fd, used)
        if pin:
            buf = self._held_buffer(used, True)
            dst = memoryview(buf).cast("B")
            dst[:used] = src[:used]
            self.recount(b, buf.pinned)
            return self.load(dst, buf.pinned)
        return self.load(src, False)

    def name_batch(self, err):
        """The loader's "sample" is the batch's number in the epoch: the message says batch,
        names the dataset index a dead worker was on, and a note lists the batch's indices."""
        i = getattr(err, "sample", None)
        msg = str(err)
        m = _LOADER_SAMPLE.search(msg)
        if m and (not self.iterable or self.iter_map):  # (iter_map: C's sample k is batch k)
            w, k = int(m.group(1)), int(m.group(2))
            what = "batch %d" % k
            if ("killed by" in msg or "exited" in msg) and not self.iterable:
                j = int(self.plan.cur[w]) if w < len(self.plan.cur) else -1
                if j >= 0 and j in self.plan.batch(k).tolist():
                    what += " (dataset index %d)" % j
                    err.sample = j
            _say(err, msg, m, what)
        if i is None or self.iterable or not hasattr(err, "add_note"):
            return
        try:
            idx = self.plan.batch(int(i)).tolist()
        except Exception:  # noqa: BLE001
            return
        err.add_note("stoke: batch %d of the epoch: dataset indices %s" % (int(i), idx))

    def drop_mail(self, batch):
        """A batch that on_error skipped or replaced: its failure, never raised, is taken out
        of its worker's mailbox (and the exception kept here for it, if any), or the mailbox
        filled up within the epoch and the budget's error came as a LoaderError."""
        data = self.plan.mail_take(batch)
        if data is None or not self.kept_errors:
            return
        try:
            exc = pickle.loads(data)[0]
        except Exception:  # noqa: BLE001 - as reraise
            return
        if type(exc) is _KeptError:
            self.kept_errors.pop(exc.token, None)

    def reraise(self, err):
        """The dataset's exception behind a loader error, if a fill kept one."""
        batch = getattr(err, "sample", None)
        data = self.plan.mail_take(batch if batch is not None else -1)
        if data is None and batch is not None:
            data = self.plan.mail_take(-1)
        if _INIT_FAILED in str(err):
            # a worker_init_fn's failure: the loader says it again at every later pass (the
            # worker is not set up again), whose mailboxes were emptied: raised as it was
            if data is not None:
                self.init_failure = data
            data = self.init_failure
        if data is None:
            return None
        try:
            exc, tb, index, pid, worker = pickle.loads(data)
        except Exception:  # noqa: BLE001 - checked by the worker; a class that changed since
            return None
        if type(exc) is _KeptError:  # the exception itself, kept in this process
            exc = self.kept_errors.pop(exc.token, None)
            if exc is None:
                return None
        elif type(exc) is _Rebuild:  # its message holds the traceback, as torch's
            exc, tb = exc.make(), ""
        m = _LOADER_SAMPLE.search(str(err))
        if m and (not self.iterable or self.iter_map):  # (C's sample K is batch K)
            _say(err, str(err), m, "batch %s" % m.group(2))
            if index is not None:
                err.sample = index
        where = "in stoke worker %d (pid %d)" % (worker, pid) if pid != os.getpid() else \
            "in the loading thread"
        note = "%s, batch %s%s%s" % (
            where, batch, "" if index is None else ", dataset index %d" % index,
            ":\n" + tb.rstrip() if tb else "")
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # Python < 3.11: the traceback text in the message
            try:
                exc.args = (("%s\n%s" % (exc.args[0], note)),) + tuple(exc.args[1:]) \
                    if exc.args else (note,)
            except Exception:  # noqa: BLE001
                pass
        return exc


# "worker W: sample K of" in a loader's error: for a Python dataset K is the batch's number
_LOADER_SAMPLE = re.compile(r"worker (\d+)(?: \(the caller's thread\))?: sample (\d+) of")


def _say(err, msg, m, what):
    """err's message with m's "sample K" (of _LOADER_SAMPLE) said as `what`."""
    err.args = (msg[:m.start(2) - 7] + what + msg[m.end(2):],) + tuple(err.args[1:])


def _pin_custom(x):
    """torch's pinning of a collate_fn's output (torch.utils.data._utils.pin_memory.pin_memory),
    for what stoke does not pin itself: its structure as torch's makes it -- a Mapping keeps
    its type (a dict where type(x)(dict) fails: a defaultdict), a namedtuple its type, a tuple
    becomes a list (torch's "backwards compatibility"), any other Sequence keeps its type (a
    list where type(x)(list) fails: a range), str and bytes stay -- and an object with a
    pin_memory attribute (a custom batch type) has it called, once, as torch's pin thread
    does.  The tensors are already in the pinned block: each stays itself, and a pin_memory()
    that pins them finds them pinned (no copy where the accelerator knows the block).
    (torch's Mapping and Sequence fallbacks pin the items again; here each is pinned once.)"""
    if torch is not None and isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (str, bytes)):
        return x
    if isinstance(x, _abc.Mapping):
        items = {k: _pin_custom(v) for k, v in x.items()}
        try:
            return type(x)(items)
        except TypeError:  # a mapping type without __init__(mapping)
            return items
    if _is_namedtuple(x):
        return type(x)(*(_pin_custom(v) for v in x))
    if isinstance(x, tuple):
        return [_pin_custom(v) for v in x]
    if isinstance(x, _abc.Sequence):
        items = [_pin_custom(v) for v in x]
        try:
            return type(x)(items)
        except TypeError:  # a sequence type without __init__(iterable)
            return items
    if hasattr(x, "pin_memory"):
        return x.pin_memory()
    return x


def _torch_samplers(dataset, iterable, shuffle, sampler, batch_sampler, batch_size, drop_last,
                    generator):
    """(loader.sampler, loader.batch_sampler) as torch's DataLoader sets them: the user's
    objects, else torch's default ones (None without torch)."""
    if torch is None:
        return sampler, batch_sampler
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    if sampler is None:
        if iterable:
            from torch.utils.data.dataloader import _InfiniteConstantSampler
            sampler = _InfiniteConstantSampler()
        elif shuffle:
            sampler = RandomSampler(dataset, generator=generator)
        else:
            sampler = SequentialSampler(dataset)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return sampler, batch_sampler


def _torch_collate(auto_collation):
    """torch's default collate_fn: default_collate with automatic batching, else
    default_convert (None without torch)."""
    if torch is None:
        return None
    from torch.utils.data._utils import collate
    return collate.default_collate if auto_collation else collate.default_convert


_PREFETCH_DEFAULT = []


def _torch_prefetch_factor(value, num_workers):
    """loader.prefetch_factor as torch's: the value given, else torch's default (2; None
    without workers in torch 2, whose default is None)."""
    if value is not None:
        return value
    d = _torch_prefetch_default()
    return d if d is not None else (2 if num_workers > 0 else None)


def _torch_prefetch_default():
    """The default of torch's DataLoader(prefetch_factor=): 2 (torch 1), None (torch 2)."""
    if not _PREFETCH_DEFAULT:
        d = 2
        if torch is not None:
            import inspect
            try:
                from torch.utils.data import DataLoader
                d = inspect.signature(DataLoader.__init__).parameters["prefetch_factor"].default
            except (KeyError, TypeError, ValueError):
                pass
        _PREFETCH_DEFAULT.append(d)
    return _PREFETCH_DEFAULT[0]


def _mp_context(ctx):
    """loader.multiprocessing_context as torch's: a start method's name becomes its context."""
    if isinstance(ctx, str):
        import multiprocessing
        return multiprocessing.get_context(ctx)
    return ctx


def _is_iter_pipe(ds):
    """Whether ds is an IterDataPipe (torch.utils.data.datapipes; a torchdata pipe), which
    torch's DataLoader shuffles (shuffle=), seeds and shards itself."""
    if torch is None:
        return False
    try:
        from torch.utils.data import IterDataPipe
    except ImportError:  # (a torch without DataPipes)
        return False
    return isinstance(ds, IterDataPipe)


def _graph_settings():
    from torch.utils.data import graph_settings
    return graph_settings


def _dist_settings():
    """(world size, rank) of torch.distributed where it is initialized, else (1, 0): torch's
    DataLoader's sharding of an IterDataPipe over the ranks."""
    try:
        from torch.utils.data.dataloader import _get_distributed_settings
    except ImportError:
        return 1, 0
    return _get_distributed_settings()


def _tensor_rows(dataset):
    """The tensors of a torch TensorDataset (samples are their rows): served by one
    index_select per tensor and batch, without a Python call per sample."""
    if torch is None or type(dataset).__name__ != "TensorDataset":
        return None
    ts = getattr(dataset, "tensors", None)
    if not isinstance(ts, tuple) or not ts or not all(isinstance(t, torch.Tensor) and
                                                       t.device.type == "cpu" for t in ts):
        return None
    from torch.utils.data import TensorDataset
    if type(dataset) is not TensorDataset:
        return None
    return ts


_SCALARS = (int, float, complex, bool, str, bytes, type(None))


_NEST_DEPTH = 4    # datasets inside datasets watched (a Subset's .dataset, ConcatDataset's)
_NEST_LIST = 1024  # a list longer than this is not looked into for datasets


def _watched(ds):
    """[(prefix, obj)]: the dataset ("") and the torch Datasets inside it, each with the
    dotted path of its attributes ("dataset." for a Subset's, "datasets.1." for a
    ConcatDataset's second), as far as _NEST_DEPTH; each object once."""
    out, seen = [("", ds)], {id(ds)}
    base = getattr(getattr(torch, "utils", None), "data", None) if torch is not None else None
    base = getattr(base, "Dataset", None)
    k = 0
    while base is not None and k < len(out):
        prefix, obj = out[k]
        k += 1
        attrs = getattr(obj, "__dict__", None)
        if type(attrs) is not dict or prefix.count(".") >= _NEST_DEPTH:
            continue
        for name, v in attrs.items():
            if type(v) in (list, tuple) and 0 < len(v) <= _NEST_LIST and isinstance(v[0], base):
                items = [("%s%s.%d." % (prefix, name, j), e) for j, e in enumerate(v)]
            elif isinstance(v, base):
                items = [("%s%s." % (prefix, name), v)]
            else:
                continue
            for p, e in items:
                if id(e) not in seen and isinstance(e, base):
                    seen.add(id(e))
                    out.append((p, e))
    return out


def _attrs_of(ds):
    """{dotted name: value} of the instance attributes of the dataset and the datasets in it
    (_watched); None when the dataset has no __dict__."""
    if type(getattr(ds, "__dict__", None)) is not dict:
        return None
    out = {}
    for prefix, obj in _watched(ds):
        attrs = getattr(obj, "__dict__", None)
        if type(attrs) is dict:
            for k, v in attrs.items():
                out[prefix + k] = v
    return out


def _attr_ids(obj, attrs=None):
    """What obj's instance attributes are, and those of the datasets in it ("dataset.scale"
    for a Subset's: _watched), to tell later which were set anew (_attrs_changed): {name:
    (kind, what)}, by value for a number or a short string, by a weak reference where the
    object takes one, else by id() (a list, a dict, a tuple); None when obj has no __dict__.
    Never the objects themselves: holding one would keep a replaced array alive.  (Ids alone
    missed a value set twice, the second at the address the first one freed.)  attrs:
    _attrs_of(obj), if taken already."""
    if attrs is None:
        attrs = _attrs_of(obj)
    if attrs is None:
        return None
    out = {}
    for k, v in attrs.items():
        if type(v) in _SCALARS and (type(v) not in (str, bytes) or len(v) <= 4096):
            out[k] = (0, v)
            continue
        try:
            out[k] = (1, weakref.ref(v))
        except TypeError:
            out[k] = (2, id(v))
    return out


def _attrs_changed(was, obj, now=None):
    """The names of obj's attributes (and its datasets': _attr_ids) set or deleted since
    _attr_ids(obj) gave `was`.  now: _attrs_of(obj), if taken already."""
    attrs = _attrs_of(obj) if now is None else now
    if attrs is None:
        return []
    out = [k for k in was if k not in attrs]
    for k, v in attrs.items():
        kind, what = was.get(k, (None, None))
        if kind == 0:
            same = v is what or (type(v) is type(what) and v == what)
        elif kind == 1:
            same = what() is v
        else:
            same = kind == 2 and id(v) == what
        if not same:
            out.append(k)
    return sorted(out, key=lambda k: (k.count("."), k))  # (a dataset replaced before its own)


def _under(name, names):
    """Whether a dotted attribute path that holds `name` ("dataset" for "dataset.scale",
    "datasets" or "datasets.1" for "datasets.1.scale") is among names."""
    parts = name.split(".")
    return any(".".join(parts[:n]) in names for n in range(1, len(parts)))


def _owner(ds, name):
    """(the object holding dotted attribute `name` of ds, the attribute's own name); None
    where the path is gone."""
    *path, last = name.split(".")
    obj = ds
    for step in path:
        if step.isdigit():
            obj = obj[int(step)] if type(obj) in (list, tuple) and int(step) < len(obj) else None
        else:
            d = getattr(obj, "__dict__", None)
            obj = d.get(step) if type(d) is dict else None
        if obj is None:
            return None, last
    return obj, last


class _Kept:
    """Batch 0 made by measure_here(): its block (ordinary memory) and bytes used, or the
    exception and dataset index of its failure; the RNG states before and after making it,
    and the dataset's attributes after (_attr_ids)."""
    __slots__ = ("before", "after", "attrs", "block", "used", "token", "error", "index")

    def __init__(self, before):
        self.before, self.after, self.attrs = before, None, None
        self.block, self.used, self.token = None, 0, None
        self.error, self.index = None, None


def _rng_states():
    """The global RNGs a dataset draws from: torch's, Python's random, NumPy's."""
    return (torch.get_rng_state() if torch is not None else None, random.getstate(),
            np.random.get_state() if np is not None else None)


def _ctor_states(generator):
    """What a loader's construction may draw from: the global RNGs (_rng_states) and the
    loader's generator (None without one)."""
    g = _torch_generator(generator)
    return _rng_states() + (g.get_state() if g is not None else None,)


def _torch_generator(generator):
    """generator when it is a torch.Generator, else None (the constructor's checks refuse
    another object, after _ctor_states took the states)."""
    if torch is not None and isinstance(generator, torch.Generator):
        return generator
    return None


def _set_ctor_state(j, state, generator):
    """Sets _ctor_states()[j] to state."""
    if j < 3:
        _set_rng(j, state)
    elif state is not None:
        _torch_generator(generator).set_state(state)


def _same_rng(a, b):
    if a is None or b is None:
        return a is b
    if torch is not None and isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if np is not None and isinstance(a, tuple) and len(a) == 5 and isinstance(a[1], np.ndarray):
        return a[0] == b[0] and a[2:] == b[2:] and np.array_equal(a[1], b[1])
    return a == b


def _set_rng(j, state):
    if state is None:
        return
    if j == 0:
        torch.set_rng_state(state)
    elif j == 1:
        random.setstate(state)
    else:
        np.random.set_state(state)


def _one_intraop_thread():
    """In a forked child: torch's intra-op threads set to one, as torch's workers do, unless
    they already are one (OMP_NUM_THREADS=1, a parent that set it): set_num_threads() creates
    a thread pool, a thread this child need not start.  (Under AddressSanitizer, a thread
    started in a child forked from a threaded parent could wait forever on a lock of the
    sanitizer's allocator copied locked by the fork: the probe's child hung so in the tests.
    The sanitizer builds now wait at every fork for the other threads to sleep:
    src/common/sanitizer_fork.c.)"""
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


_PROBE_FALLBACK = 8 << 20
_UNMEASURED_BYTES = _PROBE_FALLBACK  # the block of a batch measure() does not make
_SPARSE_BYTES = 256 << 20  # ... where nothing pins it and processes write it (grow())
_PROBE_TIMEOUT_S = 60  # the probe's child answers within this, or it is killed (the fallback)


def _probe(w, meanwhile=None):
    """The bytes of a map dataset's first batch with workers, made in a forked child so that
    the dataset's state in this process (files opened lazily by __getitem__) stays as the user
    left it, as torch's main process never calls the dataset either (an IterableDataset is not
    measured: measure()).  meanwhile() runs in this process
    while the child works (the accelerator's discovery, which forks a child of its own).
    Returns (bytes, pid): pid is the child, which closed its end of the pipe after answering
    and may still be exiting (None: reaped here); the caller reaps it (_Writer.reap_probe)."""
    r, wfd = os.pipe()
    # the GC's objects frozen across the fork, as the workers' (python/pywriter.c)
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    pid, parent = -1, os.getpid()
    try:
        pid = os.fork()
    finally:
        if froze and pid != 0:
            gc.unfreeze()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            _stoke._die_with_parent(parent)  # never outlives a parent killed meanwhile
            _one_intraop_thread()  # the parent's intra-op pool is not in this fork
            if w.processes:  # as worker 0 would run it: get_worker_info(), worker_init_fn
                w.worker = 0
                w.start_worker_epoch(0)
            else:
                w.worker = -3
            if (w.collate_fn is None and not w.collator.pad and w.batch_size
                    and w.getitems is None):
                # default_collate of fixed shapes: one sample tells the batch's size (its
                # leaves times the batch size, plus each sample's pickled part: str leaves)
                idx = w.first_keys()
                one = w.fetch(idx[:1], [None])
                n1, p1 = _probe_size(w, one, idx[:1])
                nb, _ = _probe_size(w, one * len(idx), idx)
                need = -(nb + len(idx) * p1)  # negative: exact, a small margin will do
            else:
                need = _probe_one(w, w.first_keys())
            os.write(wfd, str(need).encode())
        except BaseException as e:  # noqa: BLE001
            os.write(wfd, ("E" + pickle.dumps((e, traceback.format_exc())).hex()).encode())
            code = 1
        finally:
            try:  # the answer is complete: EOF now, not after this process's unmapping
                os.close(wfd)
            finally:
                os._exit(code)
    os.close(wfd)
    if meanwhile is not None:
        try:
            meanwhile()
        except Exception:  # noqa: BLE001 - the loader's creation reports it again
            pass
    chunks = []
    deadline = time.monotonic() + _PROBE_TIMEOUT_S
    poller = select.poll()
    poller.register(r, select.POLLIN)
    late = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            late = time.monotonic() >= deadline
            if late:
                break
            continue
        c = os.read(r, 1 << 16)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    if late:  # a child that hangs (a lock held by another thread at the fork): not waited for
        os.kill(pid, signal.SIGKILL)
        warnings.warn("stoke: measuring the first batch in a forked child took over %d s; it "
                      "was stopped and the batch block is %d bytes (pass max_batch_bytes= to "
                      "set it)" % (_PROBE_TIMEOUT_S, _PROBE_FALLBACK), RuntimeWarning,
                      stacklevel=4)
    try:
        if os.waitpid(pid, 0 if late else os.WNOHANG)[0] == pid:
            pid = None
    except ChildProcessError:  # reaped by someone else (SIGCHLD ignored: by the kernel)
        pid = None
    if late:
        return _PROBE_FALLBACK, None
    text = b"".join(chunks).decode()
    if text.startswith("E") or not text:
        # The first batch fails (a bad sample, a worker_init_fn that needs more than worker
        # 0's start): the iteration will raise it, naming the sample, as torch does; the block
        # gets a size that fits most batches.
        return _PROBE_FALLBACK, pid
    return int(text), pid


def _probe_block(make, live=None, size=1 << 20):
    """make(block) on blocks of ordinary memory, doubled until the batch fits (kept as MAGIC_LIVE
    or pickled, not MAGIC_FAST: a pickle is the larger, its size the safer measure).  A private
    anonymous mapping, not a bytearray: only the pages the batch writes are touched (a
    bytearray of twice an image batch's size was zeroed, page by page, for nothing).  Also a
    batch of this process that outgrew its block (_Writer.spill)."""
    while True:
        block = _Block(memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)), live)
        try:
            return make(block), block
        except _Overflow as o:
            size = _align(o.need) * 2


def _probe_size(w, samples, indices):
    """(bytes used, bytes of the pickle) of a block made of these samples."""
    used, block = _probe_block(lambda blk: w.write(blk, samples, list(indices)))
    return used, block.pickled


def _probe_one(w, indices):
    """The bytes of the batch of these indices."""
    samples = w.fetch(list(indices), [None])
    return _probe_size(w, samples, indices)[0]

