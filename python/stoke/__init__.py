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
import os as _os
import weakref as _weakref

from . import _stoke
from ._stoke import Batch, Field, LoaderError, StokeError

__all__ = ["DataLoader", "Batch", "Field", "LoaderError", "StokeError", "devices",
           "accelerator", "pinned_stats", "empty_cache", "version"]

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


class DataLoader(_stoke.Loader):
    """An iterable over batches, with torch.utils.data.DataLoader's argument names.

    source: a source string as for `stoke load` ("npy:PATH,labels=L.npy", "synthetic:N,...")
        or a map-style dataset (__len__, __getitem__ returning a NumPy array, or a tuple of
        them, of fixed shape; called from stoke's worker threads with the GIL held).
    num_workers: worker threads (not processes); None picks min(4, cores - 1).
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
                 drop_last=False, pin_memory=True, prefetch_factor=None, persistent_workers=None,
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
        spec = source if isinstance(source, (str, _os.PathLike)) else None
        if isinstance(spec, _os.PathLike) or (spec is not None and spec.endswith(".npy")
                                              and ":" not in spec.split(",")[0]):
            spec = "npy:" + _os.fspath(spec)
        super().__init__(spec, None if spec is not None else source,
                         batch_size=int(batch_size), shuffle=bool(shuffle), seed=int(seed),
                         num_workers=int(num_workers), drop_last=bool(drop_last),
                         pin_memory=bool(pin_memory), pin_memory_device=pin_memory_device,
                         prefetch_factor=int(prefetch_factor),
                         persistent_workers=bool(persistent_workers),
                         timeout_ms=int(round(float(timeout) * 1000)), device=device,
                         distributed=bool(distributed),
                         rank=-1 if rank is None else int(rank),
                         world_size=0 if world_size is None else int(world_size),
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
    # Worker threads calling a Python dataset must not outlive the interpreter, and Python
    # does not promise to deallocate every object at exit: destroy each live loader that has no
    # batch alive (joining its threads); for the others abandon the epoch, which waits for the
    # samples in progress and stops the threads (persistent ones stay idle, calling nothing).
    for loader in list(_live):
        try:
            if not loader._close_if_idle():
                loader.set_epoch(loader.epoch)
        except Exception:
            pass
