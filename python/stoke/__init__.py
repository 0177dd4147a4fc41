"""stoke: a data loader that collates batches straight into pinned memory, from Python.

    import stoke, torch
    loader = stoke.DataLoader("npy:train.npy,labels=labels.npy", batch_size=256,
                              shuffle=True, num_workers=4)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:
            x = torch.from_dlpack(batch["data"])     # views the pinned memory: no copy
            y = torch.from_dlpack(batch["label"])

A batch (and each field: batch["data"], batch["label"], batch.indices) implements
__dlpack__/__dlpack_device__ and the buffer protocol; its memory returns to stoke's pool when
the last tensor, array or reference viewing it is gone.  docs/python.md has the details.
"""
import atexit as _atexit
import json as _json
import math as _math
import os as _os
from operator import index as _operator_index
import weakref as _weakref

from . import _stoke
from ._stoke import Batch, Field, LoaderError, StokeError, ThreadsWarning
from ._info import build_info

__all__ = ["DataLoader", "Batch", "Field", "LoaderError", "StokeError", "ThreadsWarning",
           "devices", "accelerator", "pinned_stats", "empty_cache", "version", "build_info"]

version = __version__ = _stoke.version
_live = _weakref.WeakSet()


def devices():
    """The backends stoke considered: a list of dicts (name, origin, available, device_count,
    reason, path, caps)."""
    return _stoke.devices()


def accelerator():
    """The chosen accelerator as a dict (backend, device_count, current_device, reason), or
    None when there is none (batches then sit in ordinary memory)."""
    return _stoke.accelerator()


def pinned_stats():
    """The pinned allocator's counters (bytes_in_use, bytes_cached, ...) as a dict."""
    return _json.loads(_stoke.pinned_stats_json())


def empty_cache():
    """Releases every idle cached pinned block back to the driver."""
    _stoke.empty_cache()


def _default_workers():
    return max(1, min(4, (_os.cpu_count() or 2) - 1))


_TIMEOUT_MAX_S = (2**32 - 1) / 1000.0  # the C loader's uint32 milliseconds


def _timeout_ms(timeout):
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError("stoke: timeout must be a number of seconds, not %r" % (timeout,))
    ms = round(t * 1000) if _math.isfinite(t) else -1
    if not 0 <= ms <= 2**32 - 1:
        raise ValueError("stoke: timeout must be in 0 .. %.3f seconds (0: no limit), not %r"
                         % (_TIMEOUT_MAX_S, timeout))
    return ms


def _index(value, name):
    try:
        return _operator_index(value)
    except TypeError:
        raise TypeError("stoke: %s must be an integer, not %r" % (name, value))


def _rank_world(rank, world_size):
    """The C loader's (rank, world_size): -1 / 0 mean "from the environment", so explicit
    negatives must not reach it (rank=-2 would silently be the environment's rank)."""
    r = -1 if rank is None else _index(rank, "rank")
    w = 0 if world_size is None else _index(world_size, "world_size")
    if world_size is not None and w < 1:
        raise ValueError("stoke: world_size must be >= 1, not %r" % (world_size,))
    if rank is not None and not (0 <= r and (world_size is None or r < w)):
        raise ValueError("stoke: rank must be in 0 .. %s, not %r"
                         % ("world_size - 1 = %d" % (w - 1) if world_size is not None
                            else "world_size - 1", rank))
    return r, w


class DataLoader(_stoke.Loader):
    """An iterable over batches, with torch.utils.data.DataLoader's argument names.

    source: a source string as for `stoke load` ("npy:PATH,labels=L.npy", "synthetic:N,...")
        or a map-style dataset (__len__, __getitem__ returning a NumPy array, or a tuple of
        them, of fixed shape; called from stoke's worker threads with the GIL held).
    num_workers: worker threads (not processes); None picks min(4, cores - 1).  A Python
        dataset on more than one thread: a stoke.ThreadsWarning (once), see docs/python.md.
    pin_memory: None (default): pin when there is an accelerator (or device= /
        pin_memory_device= names one), silently not otherwise; True: pin, warning when
        nothing can pin; False: ordinary memory.
    persistent_workers: keep the threads between epochs (None: when num_workers > 0).
    timeout: seconds a sample may take (0: no limit).
    device: "cuda", "cuda:1", ... (or a torch.device): every batch is also copied to that
        device asynchronously; the batch's DLPack tensor is then the device buffer.
    distributed: load this rank's share (DistributedSampler's split and padding); rank and
        world_size from the arguments, else torchrun's RANK/WORLD_SIZE, Open MPI or Slurm.
    in_order: False delivers batches as they complete.
    worker_mode: "threads" (default) or "processes" (source strings only): each worker loads in
        a child process, so a sample that crashes it is a bad sample, not a crash of the job.
    arena: "name[:size]": batch buffers from the node-wide pinned arena `name`, shared with the
        job's other processes ("auto": the job's; None: $STOKE_ARENA; "": none; docs/ipc.md).

    Iterating it delivers one epoch.  The first iteration (and the one after set_epoch or
    load_state_dict) continues from the current position; any other starts the next epoch.
    """

    def __init__(self, source, batch_size=1, shuffle=False, seed=0, num_workers=None,
                 drop_last=False, pin_memory=None, prefetch_factor=None, persistent_workers=None,
                 timeout=0, device=None, distributed=False, rank=None, world_size=None,
                 pin_memory_device=None, in_order=True, worker_mode="threads", arena=None):
        if num_workers is None:
            num_workers = _default_workers()
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if prefetch_factor is None:
            prefetch_factor = 0  # STOKE_LOADER_PREFETCH_AUTO: 2 per worker, deeper for small batches
        if rank is not None or world_size is not None:
            distributed = True
        if device is not None:
            device = str(device)
            if device == "cuda" or device == "hip":
                device += ":0"
        if pin_memory_device == "":
            pin_memory_device = None
        if pin_memory is None:  # torch's default is False: no warning unless asked for
            pin_memory = (device is not None or pin_memory_device is not None
                          or _stoke.accelerator() is not None)
        rank, world_size = _rank_world(rank, world_size)
        timeout_ms = _timeout_ms(timeout)
        spec = source if isinstance(source, (str, _os.PathLike)) else None
        if isinstance(spec, _os.PathLike) or (spec is not None and spec.endswith(".npy")
                                              and ":" not in spec.split(",")[0]):
            spec = "npy:" + _os.fspath(spec)
        super().__init__(spec, None if spec is not None else source,
                         batch_size=int(batch_size), shuffle=bool(shuffle),
                         seed=_index(seed, "seed"),
                         num_workers=int(num_workers), drop_last=bool(drop_last),
                         pin_memory=bool(pin_memory), pin_memory_device=pin_memory_device,
                         prefetch_factor=int(prefetch_factor),
                         persistent_workers=bool(persistent_workers),
                         timeout_ms=timeout_ms, device=device,
                         distributed=bool(distributed), rank=rank, world_size=world_size,
                         in_order=bool(in_order), worker_mode=str(worker_mode),
                         arena=None if arena is None else str(arena))
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.drop_last = bool(drop_last)
        self.device = device
        _live.add(self)

    def state_dict(self):
        """The position (StatefulDataLoader's convention): a loader given it by
        load_state_dict delivers exactly the batches this one would deliver next."""
        version, seed, epoch, cursor = self._save_state()
        return {"version": version, "seed": seed, "epoch": epoch, "batches_yielded": cursor}

    def load_state_dict(self, state):
        self._restore_state(int(state["version"]), int(state["seed"]), int(state["epoch"]),
                            int(state["batches_yielded"]))

    def __repr__(self):
        return ("stoke.DataLoader(batch_size=%d, num_workers=%d, epoch=%d, rank=%d/%d)"
                % (self.batch_size, self.num_workers, self.epoch, self.rank, self.world_size))


@_atexit.register
def _stop_workers():
    # No worker thread may run Python once the interpreter finalizes (one that takes the GIL
    # then is ended by pthread_exit: freeing a torch tensor, that unwinds through libtorch and
    # aborts).  First every Python dataset stops being called (the calls in progress finish);
    # then, as Python does not promise to deallocate every object at exit, each live loader
    # with no batch alive is destroyed (its threads joined); the others abandon the epoch
    # (persistent threads stay, idle or failing at once on a Python dataset).
    _stoke._stop_python_datasets()
    for loader in list(_live):
        try:
            if not loader._close_if_idle():
                loader.set_epoch(loader.epoch)
        except Exception:
            pass
