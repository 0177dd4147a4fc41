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
import sys as _sys
import threading as _threading
import warnings as _warnings
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


def _seed_of(generator):
    """The shuffle's seed: `generator`'s initial seed (a torch.Generator), else 0 (stoke's
    shuffle is keyed by (seed, epoch))."""
    if generator is None:
        return 0
    return int(generator.initial_seed()) % 2**63  # not a draw: the generator's state is the user's


_threads_warned = []


def _warn_threads(dataset, n):
    if _threads_warned:
        return
    _threads_warned.append(1)
    import warnings
    warnings.warn(
        "stoke: the Python dataset %s runs on %d worker threads of one interpreter "
        "(worker_mode='threads'): Python code runs one thread at a time and they share its "
        "global state (the torch, NumPy and random RNGs; get_worker_info() is None), unlike "
        "worker processes (the default)" % (type(dataset).__name__, n), ThreadsWarning,
        stacklevel=4)


def _dropin_end():
    from ._dropin import _End, _Skipped
    return _End, _Skipped


def _is_iterable_dataset(ds):
    """Whether ds is iterated (an IterableDataset) rather than indexed.  With torch, only an
    IterableDataset, as torch decides: any other dataset is map-style there, so a plain iterator
    (a generator object) raises torch's TypeError from len() rather than being iterated by each
    worker process from its own copy (every item once per worker).  Without torch, duck-typed:
    no __getitem__, or an __iter__ without a __len__."""
    try:
        from torch.utils.data import IterableDataset
    except Exception:  # noqa: BLE001 - not installed, or an install that fails to import
        return not hasattr(ds, "__getitem__") or (
            hasattr(ds, "__iter__") and not hasattr(ds, "__len__"))
    return isinstance(ds, IterableDataset)


def _pin_default(device, pin_memory_device, arena):
    """(pin_memory, arena) for pin_memory left at None: on where a device or a
    pin_memory_device asks for pinned batches, or where there is an accelerator; off,
    silently, otherwise (torch's default is off), and then no arena either: the node's pinned
    arena has nothing to pin (it was passed on, and the loader warned that pin_memory is off,
    which the user never set)."""
    on = (device is not None or pin_memory_device is not None
          or _stoke.accelerator() is not None)
    return on, arena if on else None


def _arena_on(arena):
    """Whether a loader given arena= (None: $STOKE_ARENA, as the C loader reads it) takes its
    batch buffers from a node-wide arena."""
    return bool(arena if arena is not None else _os.environ.get("STOKE_ARENA"))


def _env_int(names):
    """The first of the environment variables `names` that is set, as an int (None: none)."""
    for n in names:
        v = _os.environ.get(n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                raise ValueError("stoke: %s=%r is not an integer" % (n, v)) from None
    return None


def _env_rank_world(rank, world_size):
    """(rank, world_size) of a distributed Python dataset: each given one (>= 0, >= 1) kept,
    the other from the launcher's environment (torchrun's RANK and WORLD_SIZE, Open MPI's,
    Slurm's); neither anywhere: one process, (0, 1).  One without the other is an error, as
    for a source string (it silently loaded the whole dataset)."""
    names = (("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"),
             ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"))
    r = rank if rank >= 0 else _env_int(names[0])
    w = world_size if world_size >= 1 else _env_int(names[1])
    if r is None and w is None:
        return 0, 1
    if r is None or w is None:
        raise ValueError("stoke: distributed loading needs a rank and a world size: %s, but no "
                         "%s (give rank= and world_size=, or set %s)"
                         % ("rank %d" % r if w is None else "world_size %d" % w,
                            "world size" if w is None else "rank",
                            " / ".join(names[1] if w is None else names[0])))
    if w < 1 or not 0 <= r < w:
        raise ValueError("stoke: rank %d of world_size %d: the rank must be in 0 .. %d"
                         % (r, w, w - 1))
    return r, w


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


class _Unset:
    """batch_size's default, 1, told apart from a 1 given (a source string's and a Python
    dataset's default alike: what the signature shows)."""

    def __repr__(self):
        return "1"


_UNSET = _Unset()
_BIG_BLOCK = 16 << 20  # a Python dataset's batch of this size or more: prefetch 1 per worker,
# and one buffer beyond them for the caller's batch (docs/python.md)


def _start_method(ctx):
    if ctx is None:
        return "fork"
    if isinstance(ctx, str):
        return ctx
    get = getattr(ctx, "get_start_method", None)
    return get() if get else str(ctx)


def _check_mp_context(ctx, num_workers):
    """torch's checks of multiprocessing_context (its property's setter): any value without
    worker processes is a ValueError, a name that is no start method a ValueError, anything
    else than a name or a context a TypeError; before stoke's own (only "fork" works)."""
    if ctx is None:
        return
    import multiprocessing
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading "
                         "(num_workers > 0), but got num_workers=0")
    if isinstance(ctx, (str, bytes)):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError("multiprocessing_context option should specify a valid start "
                             "method in %r, but got multiprocessing_context=%r" % (methods, ctx))
    elif not isinstance(ctx, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a "
                        "string specifying the start method, but got multiprocessing_context=%s"
                        % (ctx,))


class _DataLoader(_stoke.Loader):
    """torch.utils.data.DataLoader's constructor and iteration, batches in pinned memory.

    dataset: a Python dataset (map-style: __len__ and __getitem__, optionally __getitems__;
        or an iterable: __iter__) -- iterating yields what torch's DataLoader yields for it
        and collate_fn (the same nested tuples/lists/dicts, tensors, lists of str), each
        tensor a view of the batch's pinned memory; or a source string as for `stoke load`
        ("npy:PATH,labels=L.npy", "images:DIR,...", "tar:...") -- iterating yields stoke.Batch.
    batch_size, shuffle, sampler, batch_sampler, drop_last, collate_fn, worker_init_fn,
        generator, timeout, prefetch_factor, persistent_workers, in_order: torch's meaning.
    num_workers: worker processes for a Python dataset (forked: __getitem__, collate_fn and
        worker_init_fn run in parallel; get_worker_info() works there), 0 loads in the
        caller's thread; worker threads for a source string (None: min(4, cores - 1)).
    pin_memory: None (default): pin when there is an accelerator, silently not otherwise;
        True: pin, warning when nothing can pin; False: ordinary memory.
    multiprocessing_context: None or "fork" ("spawn" and "forkserver" are not supported).
    stoke's own: seed (of the shuffle; default: generator's initial seed; for a Python
        dataset without generator drawn from torch's default generator at every pass, as
        RandomSampler's, 0 when distributed; for a source string 0), device, distributed,
        rank, world_size, worker_mode ("processes" or "threads"), arena (docs/python.md);
        pad={"input_ids": 0} pads those ragged leaves to the batch's longest (with
        pad_to_multiple_of, max_length, and a "<name>_lengths" tensor beside a dict entry);
        max_batch_bytes: one batch's pinned block (None: twice the first batch's size plus
        256 KiB, measured at construction: in a forked child with workers; with num_workers=0
        batch 0 is made here and delivered first; an IterableDataset, or a sampler object
        with num_workers=0, is not measured: 8 MiB, larger batches spill); structure: for a
        source string, "list" yields [data, label, ...] tensors and "dict" {field: tensor}
        instead of stoke.Batch;
        on_error: "error" (default), "skip", "replace" (with ":N" or ":P%" budgets, as
        `stoke load --on-error`): a bad sample of a source string, or a batch of a Python
        dataset in which __getitem__/collate raised or whose worker died, is dropped or
        replaced (stats() counts, quarantine() lists them; for a Python dataset one
        RuntimeWarning each).

    Iterating delivers one epoch.  The first iteration (and the one after set_epoch or
    load_state_dict) continues from the current position; any other starts the next epoch.
    """

    # torch's flag (a subclass that sets it False to swap its batch_sampler, as timm's
    # MultiEpochsDataLoader does, sets this one)
    _DataLoader__initialized = False
    # an attribute, as the others (torch's property, a base of DataLoader's, checks it
    # against num_workers; stoke's constructor did)
    multiprocessing_context = None
    # what torch refuses after construction (ValueError), and what it would use at the next
    # iter() but stoke's workers, started by the constructor, never see: refused too, not
    # silently ignored
    _FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
               "persistent_workers")
    _FIXED = ("collate_fn", "worker_init_fn", "num_workers", "timeout", "prefetch_factor",
              "pin_memory", "pin_memory_device", "generator", "multiprocessing_context")

    def __setattr__(self, attr, val):
        if self._DataLoader__initialized:
            if attr in _DataLoader._FROZEN:
                raise ValueError("%s attribute should not be set after %s is initialized"
                                 % (attr, type(self).__name__))
            if attr in _DataLoader._FIXED:
                raise ValueError(
                    "stoke: %s cannot be changed after the DataLoader is made (torch's would "
                    "use it from the next iter(); stoke's workers started with the "
                    "constructor's): make a new DataLoader with it" % attr)
        super().__setattr__(attr, val)

    def __init__(self, dataset=None, batch_size=_UNSET, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=None, collate_fn=None, pin_memory=None,
                 drop_last=False, timeout=0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=None, persistent_workers=None,
                 pin_memory_device=None, in_order=True, seed=None, device=None,
                 distributed=False, rank=None, world_size=None, worker_mode=None, arena=None,
                 pad=None, pad_to_multiple_of=None, max_length=None, return_lengths=True,
                 max_batch_bytes=None, structure=None, on_error=None, source=None):
        if source is not None:  # the keyword of stoke 0.1
            dataset = source
        if dataset is None:
            raise TypeError("DataLoader() needs a dataset (or a source string: the first "
                            "argument, or source=)")
        is_source = isinstance(dataset, (str, _os.PathLike))
        self._writer = None
        self._structure = None
        self._first_iter = False
        self._fresh_plan = False
        self._len_called = None
        self._ended = None  # (epoch, cursor) where an IterableDataset's pass ended (state_dict)
        # (epoch, cursor): a map dataset's pass ended at the END block after the epoch's
        # batches (the C loader's cursor counts it): state_dict() says the next epoch
        self._end_at = None
        # END blocks the passes took (an IterableDataset's worker's end, a map dataset's past
        # its epoch's batches), and the pinned ones: not batches, left out of stats()
        self._end_blocks = [0, 0]
        if not is_source:
            return self._init_python(
                dataset, 1 if batch_size is _UNSET else batch_size, shuffle, sampler,
                batch_sampler, 0 if num_workers is None else num_workers, collate_fn,
                pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context,
                generator, prefetch_factor, persistent_workers, pin_memory_device, in_order,
                seed, device, distributed, rank, world_size, worker_mode, arena, pad,
                pad_to_multiple_of, max_length, return_lengths, max_batch_bytes, on_error)
        for name, v in (("sampler", sampler), ("batch_sampler", batch_sampler),
                        ("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn),
                        ("pad", pad)):
            if v is not None:
                hint = ""
                if name == "sampler" and type(v).__name__ == "DistributedSampler":
                    # (Lightning's DDP rebuild of a DataLoader: the source string shards
                    # itself)
                    hint = ("; for a split across ranks pass distributed=True (rank and "
                            "world size from torchrun's variables), and under Lightning "
                            "Trainer(use_distributed_sampler=False), which leaves the loader "
                            "as it is")
                raise TypeError("stoke: %s= applies to a Python dataset; a source string's "
                                "samples are stoke's own (docs/python.md)%s" % (name, hint))
        if batch_size is _UNSET:
            batch_size = 1
        if structure not in (None, "batch", "list", "dict"):
            raise ValueError("stoke: structure must be 'batch' (stoke.Batch objects), 'list' "
                             "([data, label, ...] tensors, as default_collate gives for tuple "
                             "samples) or 'dict' ({field name: tensor}), not %r" % (structure,))
        self._structure = None if structure == "batch" else structure
        if seed is None:
            seed = _seed_of(generator)
        if num_workers is None:
            num_workers = _default_workers()
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        user_prefetch_factor = prefetch_factor
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
            pin_memory, arena = _pin_default(device, pin_memory_device, arena)
        rank, world_size = _rank_world(rank, world_size)
        timeout_ms = _timeout_ms(timeout)
        spec = dataset
        if isinstance(spec, _os.PathLike) or (spec.endswith(".npy")
                                              and ":" not in spec.split(",")[0]):
            spec = "npy:" + _os.fspath(spec)
        super().__init__(spec, None,
                         batch_size=int(batch_size), shuffle=bool(shuffle),
                         seed=_index(seed, "seed"),
                         num_workers=int(num_workers), drop_last=bool(drop_last),
                         pin_memory=bool(pin_memory), pin_memory_device=pin_memory_device,
                         prefetch_factor=int(prefetch_factor),
                         persistent_workers=bool(persistent_workers),
                         timeout_ms=timeout_ms, device=device,
                         distributed=bool(distributed), rank=rank, world_size=world_size,
                         in_order=bool(in_order), worker_mode=str(worker_mode or "threads"),
                         arena=None if arena is None else str(arena),
                         on_error=None if on_error is None else str(on_error))
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.drop_last = bool(drop_last)
        self.device = device
        # torch's attributes, as given or resolved (a script that logs or checks them runs);
        # a source string has no torch sampler, collate_fn or worker_init_fn: None
        self.pin_memory = bool(pin_memory)
        self.pin_memory_device = pin_memory_device or ""
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = (user_prefetch_factor if user_prefetch_factor is not None
                                else 2 if self.num_workers > 0 else None)
        self.timeout = timeout
        self.generator = generator
        self.sampler = self.batch_sampler = self.collate_fn = self.worker_init_fn = None
        self.multiprocessing_context = None
        _live.add(self)
        self._DataLoader__initialized = True

    def _init_python(self, dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                     collate_fn, pin_memory, drop_last, timeout, worker_init_fn, mp_context,
                     generator, *rest):
        """A Python dataset's loader.  Its construction draws what torch's iter() and first
        next() draw (the base seed, the sampler's order, batch 0's making with 0 workers),
        then leaves every RNG it drew from as it found it, as torch's constructor leaves them
        (a model made after the loader got other weights than under torch's, and a second
        loader's construction made the first one draw again): the first iteration moves
        them to where the construction left them if nothing moved them since
        (_Writer.replay_construction), else draws again from where they are then."""
        from . import _dropin
        before = _dropin._ctor_states(generator)
        try:
            self._init_python_made(dataset, batch_size, shuffle, sampler, batch_sampler,
                                   num_workers, collate_fn, pin_memory, drop_last, timeout,
                                   worker_init_fn, mp_context, generator, *rest)
        finally:
            after = _dropin._ctor_states(generator)
            for j, state in enumerate(before):
                _dropin._set_ctor_state(j, state, generator)
        if self._writer is not None:
            self._writer.ctor_states = (before, after)

    def _init_python_made(self, dataset, batch_size, shuffle, sampler, batch_sampler,
                          num_workers, collate_fn, pin_memory, drop_last, timeout,
                          worker_init_fn, mp_context, generator, prefetch_factor,
                          persistent_workers, pin_memory_device, in_order, seed, device,
                          distributed, rank, world_size, worker_mode, arena, pad,
                          pad_to_multiple_of, max_length, return_lengths, max_batch_bytes,
                          on_error):
        from . import _dropin
        if _dropin.np is None:  # (its batches are made of NumPy arrays, or of torch tensors)
            raise ImportError("stoke.DataLoader over a Python dataset needs NumPy (pip install "
                              "numpy, or Debian python3-numpy); source strings (\"npy:...\", "
                              "\"images:...\", \"tar:...\") do not")
        user_prefetch_factor = prefetch_factor
        num_workers = _index(num_workers, "num_workers")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if prefetch_factor is not None:
            factor = _index(prefetch_factor, "prefetch_factor")
            if num_workers == 0 and factor != 2:
                raise ValueError("prefetch_factor option could only be specified in "
                                 "multiprocessing.let num_workers > 0 to enable "
                                 "multiprocessing, otherwise set prefetch_factor to None.")
            if factor < 0 and _dropin._torch_prefetch_default() is None:
                # torch 2's check (its default is None); torch 1.13 asserts (below)
                raise ValueError("prefetch_factor option should be non-negative")
            if factor <= 0:
                # torch's `assert prefetch_factor > 0` (1.13: at construction; torch 2's
                # worker iterator asserts it when iteration starts): 0 is no "auto" there
                raise AssertionError("prefetch_factor=%d: it must be positive with num_workers "
                                     "> 0" % factor)
        if generator is not None and _dropin.torch is not None and not isinstance(
                generator, _dropin.torch.Generator):
            # torch's TypeError (its iterator draws the base seed with random_(generator=));
            # here when the loader is made, where generator.initial_seed() was an AttributeError
            raise TypeError("generator= must be a torch.Generator or None, not %s"
                            % type(generator).__name__)
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = _is_iterable_dataset(dataset)
        if iterable and _dropin._is_iter_pipe(dataset):
            # torch's: an IterDataPipe takes shuffle=, which turns its Shufflers on or off
            # (torch 1.13 drops the Shuffler its graph_settings add to a pipe without one)
            if shuffle is not None:
                _dropin._graph_settings().apply_shuffle_settings(dataset, shuffle=shuffle)
            shuffle = None
        if iterable:
            if shuffle not in (None, False):
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 "shuffle option, but got shuffle=%s" % (shuffle,))
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 "sampler option, but got sampler=%s" % (sampler,))
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 "batch_sampler option, but got batch_sampler=%s"
                                 % (batch_sampler,))
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if batch_size is not None:  # (torch's BatchSampler: a ValueError, a bool and 2.0 too)
            try:
                size = None if type(batch_size) is bool else _operator_index(batch_size)
            except TypeError:
                size = None
            if size is None or size < 1:
                raise ValueError("batch_size should be a positive integer value, but got "
                                 "batch_size=%s" % (batch_size,))
            batch_size = size
        # (made before the loader: torch's errors, RandomSampler's on an empty dataset, first)
        torch_samplers = _dropin._torch_samplers(dataset, iterable, shuffle, sampler,
                                                 batch_sampler, batch_size, drop_last, generator)
        _check_mp_context(mp_context, num_workers)
        method = _start_method(mp_context)
        if method != "fork":
            raise ValueError("stoke: multiprocessing_context=%r: stoke's workers are forked "
                             "(their batches go to memory mapped before the fork); use None "
                             "or 'fork'" % (method,))
        if device is not None:
            raise ValueError("stoke: device= takes a source string; with a Python dataset "
                             "move the pinned batch with .to(device, non_blocking=True)")
        if worker_mode is None:
            # a TensorDataset's batches are index_selects, which run without the GIL: threads
            # serve them with no fork (no zygote, no copy of the process); else processes
            rows = (_dropin._tensor_rows(dataset) is not None and collate_fn is None
                    and pad is None and batch_size is not None)
            worker_mode = "processes" if num_workers > 0 and not rows else "threads"
        if worker_mode not in ("processes", "threads"):
            raise ValueError("stoke: worker_mode must be 'processes' or 'threads', not %r"
                             % (worker_mode,))
        # torch's own collation passed explicitly (a loader made again from another's
        # attributes) is the built-in one: the batch collated straight into the block
        user_collate_fn = collate_fn
        if collate_fn is not None and collate_fn is _dropin._torch_collate(
                batch_size is not None or batch_sampler is not None):
            collate_fn = None
        if pad is not None and collate_fn is not None:
            raise ValueError("stoke: pad= is the built-in collation; with a collate_fn, pad "
                             "inside it")
        if pad is not None and not isinstance(pad, dict):
            raise TypeError("stoke: pad= maps a leaf's name to its pad value, e.g. "
                            "{'input_ids': 0}")
        if persistent_workers is None:
            persistent_workers = False
        if rank is not None or world_size is not None:
            distributed = True
        if seed is not None:
            seed = _index(seed, "seed")
            if not 0 <= seed <= 2**64 - 1:
                raise ValueError("stoke: seed must be in 0 .. 2**64 - 1, not %r" % (seed,))
        elif generator is not None or distributed:
            # generator=: its initial seed; distributed: 0, DistributedSampler's default (the
            # ranks must agree on the permutation, whatever their global RNGs hold)
            seed = _seed_of(generator)
        # else None: shuffle=True draws each pass's seed from torch's default generator, as
        # torch's RandomSampler does (so torch.manual_seed sets the order: _Writer.shuffle_seed)
        rank, world_size = _rank_world(rank, world_size)
        if distributed:
            rank, world_size = _env_rank_world(rank, world_size)
        else:
            rank, world_size = 0, 1
        self._py_rank, self._py_world = rank, world_size
        if pin_memory_device == "":
            pin_memory_device = None
        if pin_memory is None:
            pin_memory, arena = _pin_default(None, pin_memory_device, arena)
        processes = worker_mode == "processes" and num_workers > 0
        if not processes and num_workers >= 2 and _dropin._tensor_rows(dataset) is None:
            _warn_threads(dataset, num_workers)
        w = _dropin._Writer(dataset, iterable, batch_size, drop_last, sampler,
                            batch_sampler, shuffle, seed, generator, collate_fn,
                            worker_init_fn, num_workers, processes, bool(persistent_workers),
                            pad, pad_to_multiple_of, max_length, bool(return_lengths),
                            rank, world_size,
                            # the batches a worker may have failed before the caller reaches
                            # them: the loader's buffers at most (prefetch auto: 256 + held);
                            # 16 MiB of address space a worker at most (pages where written)
                            mail_entries=min(1024, 4 + (
                                prefetch_factor * max(1, num_workers)
                                if type(prefetch_factor) is int and prefetch_factor > 0
                                else 256)))
        if not in_order and (w.iter_map or not iterable):
            # (the C loader keeps a bit per batch out of order: a map dataset's epochs may
            # grow to 4 times their batches at construction: _Plan.write says when one passes)
            w.nbatches = _dropin._ITER_BATCHES_UNORDERED if iterable else max(
                _dropin._ITER_BATCHES_UNORDERED, 4 * (w.count()[0] or 0))
            w.plan.bound = None if iterable else w.nbatches - 1  # (room for an END)
        # the accelerator is found (a child probes OpenCL drivers) while the probe's child
        # makes the first batch: the two forks overlap (num_workers=0: no probe child)
        w.measure(max_batch_bytes, _stoke.accelerator if pin_memory else None)
        w.pin = bool(pin_memory)
        if (iterable and processes and not max_batch_bytes and not (
                pin_memory and _stoke.accelerator() is not None and _arena_on(arena))):
            # (they cost the pages written, and where an accelerator pins them, each is
            # pinned as far as its batches use it; an arena's are pinned whole: docs/python.md)
            w.grow((prefetch_factor if type(prefetch_factor) is int and prefetch_factor > 0
                    else 2) * num_workers + 4)
        self._writer = w
        self._on_error = on_error if on_error not in (None, "error") else None
        self._bad_seen = 0
        self._bad_full = False
        # what the worker processes, forked from here below, have of the dataset: a change
        # the caller makes later is told (_dataset_changed), never silently left out
        w.ds_ids = _dropin._attr_ids(dataset) if processes else None
        self._ds_told = set()
        try:
            big = not w.sparse and w.blob_bytes >= _BIG_BLOCK and num_workers > 0
            if prefetch_factor is None and big:
                prefetch_factor = 1  # big batches: fewer in flight, less memory than torch's
            nb0 = None if iterable else w.count()[0]
            if nb0 is not None and num_workers > 0:
                # A few batches an epoch (a validation set): no more in flight than they and
                # each worker's END block past them (the C loader's epoch is a bound, which
                # no longer caps its buffers at the epoch's batches)
                need = max(1, -(-(nb0 + 1) // num_workers))
                have = int(prefetch_factor or 0)
                if (have == 0 and need < 2) or 0 < need < have:
                    prefetch_factor = need
            # the caller's batch: one buffer, not two, when each is big (a worker given its next
            # batch while the caller still holds the previous one waits until it is dropped)
            self._held = 1 if big else 2
            super().__init__(None, None, writer=w, batch_size=1, shuffle=False, seed=0,
                             num_workers=num_workers, drop_last=False,
                             pin_memory=bool(pin_memory), pin_memory_device=pin_memory_device,
                             prefetch_factor=int(prefetch_factor or 0),
                             persistent_workers=bool(persistent_workers) or num_workers > 0,
                             timeout_ms=_timeout_ms(timeout), device=None,
                             distributed=False, rank=-1, world_size=0,
                             in_order=bool(in_order),
                             worker_mode="processes" if processes else "threads",
                             arena=None if arena is None else str(arena),
                             round_robin=processes,  # torch's batch k -> worker k % n
                             on_error=None if on_error is None else str(on_error),
                             held_buffers=self._held,
                             # a caller that catches a dataset's error and calls next() again
                             # gets the rest of the epoch, as from torch's iterator (an
                             # IterableDataset's worker process goes on calling its iterator;
                             # one that replaced a dead one ends the epoch: _ITER_LOST)
                             errors_go_on=True,
                             pin_on_use=w.sparse)
            # the user's persistent_workers, not the C loader's (the workers persist anyway):
            # a superseded iterator raises unless torch's would go on (python/loader.c)
            self._passes_go_on = bool(persistent_workers)
            # (sparse blocks of a loader that pins: the C loader pins each as far as used)
            w.pin_lazy = w.sparse and self.pinned_backend is not None
        except StokeError as e:
            exc = w.reraise(e)
            try:
                if exc is not None:
                    raise exc from e
                raise
            finally:  # no cycle exc -> traceback -> this frame -> exc: see _batches
                exc = None
        finally:  # measure()'s child exited while the loader was made
            w.reap_probe()
        w.plan.head[_dropin._Plan.H_LIVE] = 1  # (the C loader's length(): the planned epoch's)
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        # torch's attributes, with torch's meaning: the user's sampler object (its set_epoch
        # reaches the sampler this loader iterates), else torch's SequentialSampler or
        # RandomSampler over the dataset (shuffle=True: stoke's own order is its permutation
        # keyed by (seed, epoch), not that sampler's: docs/python.md), the BatchSampler, torch's
        # default_collate / default_convert
        self.sampler, self.batch_sampler = torch_samplers
        self._samplers = tuple(torch_samplers)  # (what a repeating wrapper wraps: _repeats)
        self.collate_fn = user_collate_fn if user_collate_fn is not None else \
            _dropin._torch_collate(batch_size is not None or batch_sampler is not None)
        self.prefetch_factor = _dropin._torch_prefetch_factor(user_prefetch_factor, num_workers)
        self.multiprocessing_context = _dropin._mp_context(mp_context)
        self.pin_memory_device = pin_memory_device or ""
        self.generator = generator
        self.timeout = timeout
        self._timeout_set = timeout > 0  # (the C loader's: what iter() checks, as torch's)
        self.worker_init_fn = worker_init_fn
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        self.device = None
        self._iterable = iterable
        self._in_order = bool(in_order)
        # an IterableDataset's position is replayable only from one thread's iterator: worker
        # processes fill the batches of a map-style loader, threads share one iterator
        self._no_state = iterable and (processes or num_workers >= 2)
        self._first_iter = True
        self._fresh_plan = False  # set_epoch()/load_state_dict() planned an epoch's start
        _live.add(self)
        self._DataLoader__initialized = True
        check = getattr(self, "check_worker_number_rationality", None)  # (torch's method)
        if check is not None and processes:
            # torch's warning when the worker processes outnumber the CPUs this process may
            # run on ("This DataLoader will create 3 worker processes in total. ..."); worker
            # threads are no processes: not told
            check()

    def __iter__(self):
        if self._writer is not None and self._repeats():
            return _Repeat(self)
        return self._pass()

    def _repeats(self):
        """Whether the batch_sampler (sampler, without one) was replaced after construction by
        a wrapper of it, which torch's iterator repeats: YOLOv5's InfiniteDataLoader (through
        object.__setattr__) and timm's MultiEpochsDataLoader (with _DataLoader__initialized
        False) wrap it in a _RepeatSampler whose .sampler is the one given, and iterate one
        iter() of the loader for ever.  Another object there is refused: stoke's workers
        plan from the loader's own order."""
        made = self._samplers
        now = (self.sampler, self.batch_sampler)
        if now[0] is made[0] and now[1] is made[1]:
            return False
        k = 1 if made[1] is not None else 0
        if now[1 - k] is made[1 - k] and getattr(now[k], "sampler", None) is made[k]:
            return True
        raise ValueError(
            "stoke: the DataLoader's %s was replaced after it was made (%r): stoke's workers "
            "take the order from the one it was made with; only a wrapper that repeats it, "
            "its .sampler the one replaced (YOLOv5's InfiniteDataLoader, timm's "
            "MultiEpochsDataLoader), is supported: make a new DataLoader with the new one"
            % ("batch_sampler" if k else "sampler", now[k]))

    def _pass(self):
        """iter() of one pass (__iter__ without a repeating sampler)."""
        if self._writer is None:
            if self._structure:
                return self._fields(super().__iter__())
            return super().__iter__()
        w = self._writer
        if self.num_workers == 0 and self._timeout_set:
            # torch's single-process iterator's `assert self._timeout == 0`: no worker to wait
            # for (stoke timed the caller's own batch and raised a LoaderError after it came)
            raise AssertionError("timeout=%s needs num_workers > 0 (torch asserts timeout == 0 "
                                 "when it iterates without workers)" % (self.timeout,))
        w.lazy = w.lazy_order()
        try:
            return self._pass_hooks(w)
        finally:
            w.lazy = False

    def _pass_hooks(self, w):
        """_pass's planning and the C iterator, w.lazy set: with num_workers=0 and a sampler
        object the sampler is read at the first next() (_batches), as torch's."""
        first_pass = not w.started
        if first_pass:
            # (the workers start at this pass's first next(): none reads the patch, nor the rows)
            w.ship_changes()
            w.refresh_rows()
        if self._first_iter:
            # (cleared once its planning is done: a sampler that raises leaves it to the next
            # iter(), which reads the sampler again, as torch's)
            w.replay_construction()
            w.first_iteration()
            if w.rng_moved():
                # torch draws the workers' base seed when iteration starts: the RNG was seeded
                # (or drawn from) since construction, so epoch 0 starts again with a new draw
                w.redraw()
                self._epoch_hook(super().set_epoch, self.epoch)
            elif not w.planned:
                # the sampler's order is taken now, as torch's iter() takes it (no batch was
                # made yet: the workers start at the first next()); with num_workers=0 at
                # the first next(), as torch's single-process iterator takes it
                if w.lazy:
                    w.pending = True
                else:
                    w.plan_now(self.epoch)
            elif w.plan_stale():  # (construction planned epoch 0)
                self._plan_again()
            self._first_iter = False
        elif self._fresh_plan and w.planned and w.plan_stale():  # (set_epoch, load_state_dict)
            self._plan_again()
        elif not w.planned and not w.iterable and not w.pending:
            # the epoch's planning failed (its sampler raised in set_epoch or at the start of
            # this epoch's pass): the epoch again, its hook reading the sampler again (workers
            # may have made batches of the last plan since: the new run discards them), never
            # the last plan's batches delivered as this epoch's
            self._epoch_hook(super().set_epoch, self.epoch)
        self._fresh_plan = False
        # one pass at a time: a newer iter() supersedes the iterators made before it (the C
        # iterator's next() raises then: python/loader.c iter_next)
        it = self._epoch_hook(super().__iter__)
        w.iterating()  # persistent workers: seeded once, with this pass's base seed
        if w.ds_ids is not None and (first_pass or not self.persistent_workers):
            self._dataset_changed()
        w.started = True
        # torch's warning on an IterableDataset that yields more than len(loader) said: the
        # length read by len(loader) before this iteration began (_IterableDataset_len_called)
        return _Pass(self._batches, it, self._len_called)

    def _plan_again(self):
        """The planned epoch's start was of another dataset length than now's (a curriculum's
        step at the top of the epoch loop, after the loader was made, a set_epoch() or a
        load_state_dict()): torch's sampler reads the length at iter(), so the epoch is
        planned again by the set_epoch hook, its base and shuffle seeds kept (_Writer.again;
        a batch made of the old plan is discarded by the new run, and the workers start the
        epoch again)."""
        w = self._writer
        w.again()
        try:
            self._epoch_hook(super().set_epoch, self.epoch)
        finally:
            w.base_again = w.restore_seed = None

    def _dataset_changed(self):
        """Warns (RuntimeWarning, once an attribute) of the dataset's attributes set in this
        process that this pass's worker processes do not have: torch's workers, started by
        each iter() without persistent_workers (by the first with them), see them.  stoke's
        workers, forked at construction, are sent the attributes set since
        (_Writer.ship_changes) when a pass starts; told here are those that do not pickle,
        and those set after the pass started (a set_epoch() or load_state_dict() starts it:
        the iter() after it runs no set_epoch hook, and the workers may have begun).  Only
        attributes set anew are seen, not an object changed in place."""
        from . import _dropin
        w = self._writer
        why = dict(w.unsent)
        for k in _dropin._attrs_changed(w.shipped, self.dataset) if w.shipped is not None else ():
            why.setdefault(k, "set after this pass started (its set_epoch() or "
                              "load_state_dict()): set it before")
        changed = sorted(k for k in why if k not in self._ds_told)
        if not changed:
            return
        self._ds_told.update(changed)
        _warnings.warn(
            "stoke: the dataset's %s changed after this DataLoader started its worker "
            "processes, and could not be sent to them (%s), which keep it as it was then "
            "(torch's%s would see the change): make a new DataLoader after changing the "
            "dataset, or change it in the workers (worker_init_fn, or the dataset's own code "
            "there)"
            % (", ".join(repr(k) for k in changed), "; ".join(
                "%s: %s" % (k, why[k]) for k in changed),
               "" if self.persistent_workers else ", started at each iter(),"),
            RuntimeWarning, stacklevel=3)

    def set_epoch(self, epoch):
        self._first_iter = False
        self._ended = self._end_at = None
        if self._writer is None:
            return super().set_epoch(epoch)
        self._fresh_plan = True
        return self._epoch_hook(super().set_epoch, epoch)

    def _epoch_hook(self, call, *args):
        """call(*args) of the C loader, which runs the dataset's set_epoch hook (a new pass
        plans its batches: the sampler is read): an exception there (a sampler's bad key) is
        raised as itself, from the loader's error, which only said that set_epoch failed."""
        try:
            return call(*args)
        except StokeError as e:
            self._raise_dataset_error(e)

    def _raise_dataset_error(self, e, name_batch=False):
        """Raises, while e (the C loader's StokeError) is handled, what the Python code behind
        it raised: Ctrl-C or sys.exit() as themselves (as torch's loop does), else the
        dataset's (or sampler's) exception from e, else e itself (its batch named).  Each
        exception is cleared on the way out: a cycle (exc -> traceback -> this frame -> exc)
        left the failed loader to the cyclic collector, which may run on one of the loader's
        own worker threads, and a loader destroyed there freed the slot its fill was still
        writing (a crash seen in test_errors)."""
        exc = self._writer.take_interrupt()
        try:
            if exc is not None:
                raise exc from None
        finally:
            exc = None
        exc = self._writer.reraise(e)
        try:
            if exc is not None:
                raise exc from e
            if name_batch:
                self._writer.name_batch(e)
            raise
        finally:
            exc = None

    def load_state_dict(self, state):
        self._no_state_here("load_state_dict")
        self._first_iter = False
        self._ended = self._end_at = None
        return self._load_state(state)

    def _no_state_here(self, what):
        """An IterableDataset's position in worker processes (or threads sharing an iterator)
        is neither saved nor restored: a StokeError (a restore took the cursor and ignored it:
        the whole epoch again, or none, with a false warning that it was cut)."""
        if self._writer is not None and self._no_state:
            raise StokeError("stoke: %s of an IterableDataset needs num_workers 0, or 1 "
                             "with worker_mode='threads' (the position of worker processes, or "
                             "of threads sharing one iterator, cannot be replayed)" % what)

    def _fields(self, it):
        """A source string's batches as torch's structure: each field a tensor viewing the
        batch (torch.from_dlpack; NumPy arrays without torch)."""
        try:
            import torch
            conv = torch.from_dlpack
        except Exception:  # noqa: BLE001 - not installed, or an install that fails to import
            import numpy
            conv = numpy.from_dlpack
        as_dict = self._structure == "dict"
        for b in it:
            names = b.keys()
            box = [{n: conv(b[n]) for n in names} if as_dict else [conv(b[n]) for n in names]]
            b = None
            yield box.pop()  # (the suspended frame keeps no reference to the batch: _batches)

    def _batches(self, it, len_called, st):
        """The pass's batches from C iterator `it`; st: what the pass counted, kept when the
        generator is made again (_Pass).  Its warnings' stacklevels count _Pass.__next__."""
        if st.get("unplanned"):  # the sampler raised at the first next(): the pass is over,
            return                 # as torch's (its sampler's iterator is)
        self._writer.workers_began = True  # (a pass left from here on is cut: pass_reseed)
        if self._writer.pending:  # (num_workers=0: iter() left the sampler's read to here)
            st["unplanned"] = True
            self._writer.plan_pending()
            del st["unplanned"]
        decode = self._writer.decode
        ended = st["ended"]  # an iterable dataset in worker processes: the exhausted workers
        end, skipped = _dropin_end()
        # the caller holds all the buffers but the workers' last one: copy this one out
        limit = max(2, int(self.stats()["buffers"]) - self._held + 1)
        while True:
            try:
                b = next(it)
            except StopIteration:
                if self._writer.iter_map and len(ended) < self.num_workers:
                    if st["failed"]:  # (an error ended the epoch: _Pass made this generator)
                        _warnings.warn(
                            "stoke: the IterableDataset's epoch ended at the error raised "
                            "before (an interrupt, a timeout, the on_error budget, or a worker "
                            "process that died, whose iterator cannot be resumed): the other "
                            "worker processes' iterators give no more",
                            RuntimeWarning, stacklevel=3)
                    else:
                        _warnings.warn(
                            "stoke: the IterableDataset's epoch was cut after %d batches, the "
                            "most a stoke.DataLoader with worker processes delivers in one "
                            "epoch (its workers' iterators were not exhausted)"
                            % self._writer.nbatches, RuntimeWarning, stacklevel=3)
                if self._iterable and not self._no_state:
                    self._mark_ended()
                self._writer.pass_ended = True  # (its persistent workers: pass_reseed)
                return
            except StokeError as e:
                self._raise_dataset_error(e, name_batch=True)
            if self._outstanding - self._fenced >= limit:  # (fenced ones come back)
                out = self._writer.decode_copy(b)
            else:
                out = decode(b)
            if type(out) is end:  # (not a batch the caller sees: stats() leaves it out)
                self._end_blocks[0] += 1
                self._end_blocks[1] += bool(b.is_pinned)
            del b
            if self._on_error:
                self._warn_bad()
            if out is skipped:  # a batch that on_error skipped (None is a collate_fn's batch)
                continue
            if type(out) is end:
                # a map dataset's: batch i past the epoch's batches (in order: the first one
                # ends the pass; out of order, the batches before it may still come, each
                # worker's in its order: its END ends its share)
                ended.add(out.worker)
                if len(ended) >= self.num_workers or (not self._iterable and (
                        self._in_order or self.num_workers < 2)):
                    if not self._iterable:
                        self._mark_end_at()
                    self._writer.pass_ended = True
                    return
                continue
            st["yielded"] += 1
            yielded = st["yielded"]
            if not self._iterable and yielded == self._writer.plan.nbatches():
                self._writer.pass_ended = True  # (its last batch: every one was made)
            if len_called is not None and yielded > len_called:
                _warnings.warn(  # torch's words (torch.utils.data.dataloader)
                    "Length of IterableDataset %s was reported to be %d (when accessing "
                    "len(dataloader)), but %d samples have been fetched. %s"
                    % (self.dataset, len_called, yielded,
                       "For multiprocessing data-loading, this could be caused by not "
                       "properly configuring the IterableDataset replica at each worker. "
                       "Please see https://pytorch.org/docs/stable/data.html#torch.utils."
                       "data.IterableDataset for examples." if self.num_workers > 0 else ""),
                    stacklevel=3)
            # not kept by this frame while it is suspended, nor while the next batch is
            # awaited: a caller that dropped its batch has given its buffer back, and a worker
            # may take it instead of another one; and a batch's tensors hold its loader in a
            # way the cyclic GC cannot see (a torch storage), so a suspended frame holding one
            # would make a pass kept on its loader (loader.it = iter(loader), a trainer's
            # iterator whose collate_fn is its bound method) a cycle the GC cannot collect
            box = [out]
            out = None
            yield box.pop()

    def _mark_end_at(self):
        try:
            self._end_at = self._save_state()[2:4]
        except StokeError:  # (in_order=False: state_dict() raises the same)
            self._end_at = None

    def stats(self):
        st = super().stats()
        if self._writer is not None:
            # a Python dataset's batches as written (the C loader counts whole blocks, which
            # are room, sized before the batches came)
            st["bytes"] = self._writer.data_bytes
            # and pinned as their tensors are (a copy's memory, not the block's)
            st["pinned_batches"] += self._writer.pin_delta
            st["pageable_batches"] -= self._writer.pin_delta
        n, pinned = self._end_blocks
        if n:
            st["samples"] -= n  # (a Python dataset's C samples are its batches)
            st["batches"] -= n
            st["pinned_batches"] -= pinned
            st["pageable_batches"] -= n - pinned
        return st

    def _mark_ended(self):
        """An IterableDataset's pass ended: state_dict() at this position is the next epoch's
        start (a restore would replay the whole epoch, then give an empty pass)."""
        try:
            self._ended = self._save_state()[2:4]
        except StokeError:  # (in_order=False: state_dict() raises the same)
            self._ended = None

    def _warn_bad(self):
        """One RuntimeWarning per batch that on_error skipped or replaced (a Python dataset's
        bad "sample" is a whole batch: an exception in it, or its worker's death)."""
        for e in self.quarantine(self._bad_seen):
            self._bad_seen += 1
            self._writer.drop_mail(int(e["index"]))
            what = "skipped" if e["action"] == "skip" else "replaced by batch %s" % (
                e["replacement"],)
            _warnings.warn("stoke: batch %d of epoch %d %s (on_error=%r): %s" % (
                e["index"], e["epoch"], what, self._on_error,
                e["reason"] if e["source"].startswith("python:") else
                "%s: %s" % (e["source"], e["reason"])), RuntimeWarning,
                stacklevel=4)
        if (self._bad_seen >= _stoke.QUARANTINE_MAX and not self._bad_full
                and self.stats()["bad_samples"] > self._bad_seen):
            self._bad_full = True  # the quarantine keeps no more entries: say so once
            _warnings.warn("stoke: more than %d batches were skipped or replaced (on_error=%r): "
                           "the later ones are counted in stats() but not warned about one by "
                           "one" % (_stoke.QUARANTINE_MAX, self._on_error), RuntimeWarning,
                           stacklevel=4)

    # a Python dataset's split is the drop-in's (_dropin._Writer), not the C loader's
    @property
    def rank(self):
        r = getattr(self, "_py_rank", None)
        return _stoke.Loader.rank.__get__(self) if r is None else r

    @property
    def world_size(self):
        w = getattr(self, "_py_world", None)
        return _stoke.Loader.world_size.__get__(self) if w is None else w

    def __len__(self):
        if self._writer is not None and not self._iterable:
            # torch's: from the lengths of now (its sampler's, batch_sampler's, dataset's);
            # an epoch has what the sampler's pass gives (_Writer.count)
            n = self._writer.count()[0]
            if n is None:  # a sampler without __len__: torch's TypeError, from its len()
                return len(self.batch_sampler if self.batch_sampler is not None
                           else self.sampler)
            return n
        if self._writer is not None and self._iterable:
            # TypeError when the dataset has no length, as torch; it is not the epoch's bound
            # (the iterators are), only what torch's warning compares with (_batches)
            n = self._len_called = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return super().__len__()

    def state_dict(self):
        """The position (StatefulDataLoader's convention): a loader given it by
        load_state_dict delivers exactly the batches this one would deliver next (with
        in_order=False, also those delivered past the first gap in the epoch's order: the
        position is the unbroken run from the start).  An iterable dataset's state also holds
        "workers" (num_workers + 1: a restore needs the same).  An IterableDataset's pass that
        ended is saved as the next epoch's start (its length is not known: a restore would
        replay the whole epoch, then give an empty pass).  A Python map dataset's state, once
        a pass of its epoch began, holds "epoch_batches", that epoch's batches (its epochs'
        lengths may change, and a len() may be an estimate: a restore could not tell the end
        from them); a state at the end of the epoch (its last batch delivered) is made the
        next epoch's start by load_state_dict, as a source string's whole epoch is."""
        self._no_state_here("state_dict")
        version, seed, epoch, cursor, workers = self._save_state()
        w = self._writer
        batches = None
        if w is not None and not self._iterable:
            if self._end_at is not None and self._end_at == (epoch, cursor):
                # the pass ended at the END block past the epoch's batches, which the C
                # loader's cursor counts
                batches = cursor = w.plan.nbatches()
            elif cursor > 0 and w.planned and int(w.plan.head[w.plan.H_EPOCH]) == epoch:
                batches = w.plan.nbatches()
        ended = self._ended is not None and self._ended == (epoch, cursor)
        if ended:
            epoch, cursor = epoch + 1, 0
        if self._writer is not None and self._writer.shuffle_drawn():
            seed = self._writer.epoch_seed  # the seed this epoch's shuffle drew
        st = {"version": version, "seed": seed, "epoch": epoch, "batches_yielded": cursor}
        if workers:
            st["workers"] = workers
        if batches is not None:
            st["epoch_batches"] = batches
        if w is not None and w.pipe and not ended:
            # an IterDataPipe's pass is replayed with its random pipes' seed (a Shuffler's
            # order), not a new draw; the next pass draws its own
            st["pipe_seed"] = int(w.plan.head[w.plan.H_PIPE])
        return st

    def _load_state(self, state):
        seed = int(state["seed"])
        epoch, cursor = int(state["epoch"]), int(state["batches_yielded"])
        workers = int(state.get("workers", 0))
        # A map dataset's state after the epoch's last batch (the usual end-of-epoch
        # checkpoint) resumes at the start of the next epoch, as the saving loader's next pass
        # does (torchdata's StatefulDataLoader's rule): not an empty pass, then that epoch.
        # The epoch's batches are the state's own where it has them (a Python dataset's
        # state_dict), else its length now (a state without them: a source string's, one
        # saved before a pass of the epoch began, or by an older stoke).
        if "epoch_batches" in state:
            end = cursor >= int(state["epoch_batches"])
        else:
            n = (_stoke.Loader.__len__(self) if self._writer is None or self._iterable
                 else self._writer.count()[0] or 0)
            end = not workers and 0 < n <= cursor
        if end:
            epoch, cursor = epoch + 1, 0
        w = self._writer
        if w is not None and w.shuffle_drawn():
            # the saved epoch's shuffle seed, not a new draw (the C loader's own seed is 0);
            # the next epoch's is drawn, as the saving loader's next pass draws it
            w.restore_seed, seed = (None if end else seed), 0
        if w is not None and w.pipe and "pipe_seed" in state and not end:
            w.restore_pipe = int(state["pipe_seed"])
        try:
            self._restore_state(int(state["version"]), seed, epoch, cursor, workers)
        finally:
            if w is not None:
                w.restore_seed = w.restore_pipe = None
        # an epoch's start, planned now: iter() plans it again if the length changes before
        # (a position inside the epoch stays the plan's of now: its batches delivered were of it)
        self._fresh_plan = w is not None and cursor == 0

    def __repr__(self):
        return ("stoke.DataLoader(batch_size=%s, num_workers=%d, epoch=%d, rank=%d/%d)"
                % (self.batch_size, self.num_workers, self.epoch, self.rank, self.world_size))


_made_lock = _threading.Lock()


def _make_dataloader():
    """stoke.DataLoader: _DataLoader, and torch.utils.data.DataLoader too where torch imports,
    so that isinstance(loader, torch.utils.data.DataLoader) is True, as the frameworks that
    decide by it need: Lightning injects its DistributedSampler under DDP only into a
    DataLoader (rebuilt as type(loader)(**its arguments, sampler=...)); passed through, each
    rank loaded the whole dataset.  Made at first use (the module's __getattr__), so that
    `import stoke` does not import torch (0.7 s) for a script that does not need it.  Every
    method is _DataLoader's (first in the MRO); torch's left are its properties
    _auto_collation and _index_sampler, which read the same attributes."""
    with _made_lock:
        cls = globals().get("DataLoader")
        if cls is not None:
            return cls
        try:
            from torch.utils.data import DataLoader as torch_loader
            bases = (_DataLoader, torch_loader)
        except Exception:  # noqa: BLE001 - not installed, or a broken install (an OSError
            bases = (_DataLoader,)  # of its libraries): a source string still loads
        cls = type("DataLoader", bases, {"__module__": __name__, "__qualname__": "DataLoader",
                                         "__doc__": _DataLoader.__doc__})
        globals()["DataLoader"] = cls
        return cls


def __getattr__(name):
    if name == "DataLoader":
        return _make_dataloader()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | {"DataLoader"})


class _Repeat:
    """What iter() returns where the loader's batch_sampler was wrapped to repeat
    (DataLoader._repeats): the loader's passes one after the other, each the next epoch, as
    torch's one iterator over the repeating sampler draws each pass of it again.  An epoch
    without batches ends it (torch's would iterate the empty sampler for ever)."""

    __slots__ = ("_loader", "_it", "_got")

    def __init__(self, loader):
        self._loader, self._it, self._got = loader, None, True

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._it is None:
                if not self._got:
                    raise StopIteration
                self._it, self._got = self._loader._pass(), False
            try:
                b = next(self._it)
            except StopIteration:
                self._it = None
                continue
            self._got = True
            return b


class _Pass:
    """What iter() of a Python dataset's loader returns: the batches of one pass, from a
    generator (DataLoader._batches) made again over the same C iterator when an exception left
    it.  A generator is closed by the exception it raises, so a caller that caught one around
    next(it) (a KeyboardInterrupt: the C iterator goes on where it was; a dataset's error) got
    StopIteration from then on: the rest of the pass lost, silently.  torch's iterator goes on."""

    __slots__ = ("_make", "_it", "_len", "_st", "_gen", "__weakref__")

    def __init__(self, make, it, len_called):
        self._make, self._it, self._len = make, it, len_called
        self._st = {"yielded": 0, "ended": set(), "failed": False}
        self._gen = make(it, len_called, self._st)

    def __iter__(self):
        return self

    def __len__(self):
        # torch's iterator's: len(its loader) for a map-style dataset; an IterableDataset's
        # has none (and its len(loader) would count as asked: a warning at the next pass)
        loader = self._make.__self__
        if loader._iterable:
            raise TypeError("object of type '_Pass' has no len(): an IterableDataset's "
                            "iterator has none, as torch's")
        return len(loader)

    def __next__(self):
        try:
            return next(self._gen)
        except StopIteration:
            raise
        except BaseException as e:
            # (a dataset's error does not end the epoch: errors_go_on; a worker process's
            # death ends an IterableDataset's: _ITER_LOST)
            if not isinstance(e, KeyboardInterrupt):
                self._st["failed"] = True
            self._gen = self._make(self._it, self._len, self._st)
            if (type(e) is RuntimeError and isinstance(e.__cause__, StopIteration)
                    and str(e) == "generator raised StopIteration"):
                # a map dataset's __getitem__ (collate_fn) raised StopIteration, which the
                # generator turned into this (PEP 479): torch's iterator raises it from
                # next(), which ends the caller's loop quietly (a later next() goes on)
                raise e.__cause__ from None
            raise


_fence_backend = []  # (the accelerator's backend, once asked)


def _copy_fence():
    """The release fence of pinned memory given back (python/fence.c): with CUDA (or ROCm)
    initialized in this process, a torch.cuda.Event recorded on the current stream, after
    any `tensor.to("cuda", non_blocking=True)` of the batch queued there; the batch's block
    is reused once it is done.  torch's caching host allocator does so for its own pinned
    memory, not for stoke's.  None (given back at once) without torch or CUDA: no copy from
    it can be in flight."""
    torch = _sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    if not _fence_backend:
        acc = _stoke.accelerator()
        _fence_backend.append(acc.get("backend") if acc else None)
    if _fence_backend[0] not in ("cuda", "hip"):
        return None  # (pinned for another runtime: torch copies from it synchronously)
    ev = torch.cuda.Event()
    ev.record()
    return ev


_stoke._set_release_fence(_copy_fence)


@_atexit.register
def _stop_workers():
    # No worker thread may run Python once the interpreter finalizes (one that takes the GIL
    # then is ended by pthread_exit: freeing a torch tensor, that unwinds through libtorch and
    # aborts).  First every Python dataset stops being called (the calls in progress finish);
    # then, as Python does not promise to deallocate every object at exit, each live loader is
    # stopped (its threads joined, its processes ended; batches alive keep their memory); one
    # that another thread is inside a call of abandons the epoch instead, which after
    # _interrupt() joins its threads, persistent ones too (stoke_loader_interrupt).
    _stoke._stop_python_datasets()
    # Nothing wants the workers' batches any more: each loader is marked interrupted, so that
    # worker processes busy on a sample are SIGKILLed at once (the exit waited for their
    # samples however long they took when a batch was still alive, a minute-long sample a
    # minute; a destroy gave each 2 s).  torch's workers are as quick: multiprocessing's own
    # exit hook terminates its daemonic processes.
    for loader in list(_live):
        loader._interrupt()
        try:
            if not loader._close_if_idle():  # (after the copies from its fenced batches)
                loader.set_epoch(loader.epoch)
        except Exception:
            pass
    try:
        _stoke._settle_pinned(True)
    except Exception:
        pass
    _stoke._set_release_fence(None)
