# Type stubs of the package stoke (PEP 561: py.typed beside it).  Every name in stoke.__all__
# is here; tests/python/test_typing.py checks that, and runs mypy --strict on an example.
# torch and numpy types are written as Any (with the type meant in a comment), so that checking
# a script that uses stoke does not make mypy analyze torch.
import os
from typing import (Any, Callable, Generic, Iterable, Iterator, Literal, Mapping, Protocol,
                    Sequence, TypedDict, TypeVar, overload)

__all__ = ["DataLoader", "Batch", "Field", "LoaderError", "StokeError", "ThreadsWarning",
           "devices", "accelerator", "pinned_stats", "empty_cache", "version", "build_info"]

version: str
__version__: str

_T_co = TypeVar("_T_co", covariant=True)


class _MapDataset(Protocol):
    """A map-style dataset: dataset[i] for i in range(len(dataset)) (torch's Dataset)."""
    def __getitem__(self, index: int, /) -> Any: ...


class StokeError(RuntimeError):
    """An error reported by libstoke."""
    code: int  # a negative STOKE_E* code
    code_name: str  # "STOKE_EIO", ...
    message: str
    sample: int | None  # the dataset index concerned, if any


class LoaderError(StokeError):
    """A failing sample or batch; `sample` is its dataset index."""


class ThreadsWarning(RuntimeWarning):
    """A Python dataset runs on several worker threads of one interpreter."""


class Field:
    """One field of a batch (or its indices) as a tensor without a copy: the buffer protocol
    (memoryview(f), numpy.asarray(f)) and DLPack (torch.from_dlpack(f))."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __dlpack__(self, *, stream: int | Any | None = None,
                   max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None,
                   copy: bool | None = None) -> Any: ...  # a PyCapsule
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def data_ptr(self) -> int: ...


class Batch:
    """A batch from a source string: batch["data"], batch["label"], batch.indices (Fields that
    view the pinned memory); the batch itself is its first field (buffer protocol, DLPack)."""
    def __getitem__(self, key: str | int, /) -> Field: ...
    def __len__(self) -> int: ...
    def keys(self) -> tuple[str, ...]: ...
    @property
    def indices(self) -> Field: ...
    @property
    def epoch(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def is_pinned(self) -> bool: ...
    def __dlpack__(self, *, stream: int | Any | None = None,
                   max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None,
                   copy: bool | None = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def data_ptr(self, field: str | int = 0, /) -> int: ...


class _LoaderStats(TypedDict):
    samples: int
    batches: int
    bytes: int
    pinned_batches: int
    pageable_batches: int
    device_copies: int
    wait_s: float
    wait_p50_s: float
    wait_p99_s: float
    worker_busy_s: float
    buffers: int
    buffer_bytes: int
    bad_samples: int
    skipped_samples: int
    replaced_samples: int
    worker_restarts: int


class _BadSample(TypedDict):
    index: int
    epoch: int
    code: int
    action: Literal["error", "skip", "replace"]
    replacement: int | None
    source: str
    reason: str


class _LoaderStateKeys(TypedDict):
    version: int
    seed: int
    epoch: int
    batches_yielded: int


class _LoaderState(_LoaderStateKeys, total=False):
    workers: int  # an iterable dataset's: num_workers + 1


class DataLoader(Generic[_T_co]):
    """torch.utils.data.DataLoader's arguments (and behaviour) plus stoke's own keywords.
    A source string ("npy:...", "images:...", "tar:...", "synthetic:...") or a path yields
    stoke.Batch (or, with structure="list"/"dict", tensors); a Python dataset yields what
    torch's DataLoader yields for it.  Where torch imports, a subclass of
    torch.utils.data.DataLoader too (isinstance() is True; not declared here, so that this
    stub needs no torch).  (Generic in the stub only: annotate a variable as
    "stoke.DataLoader[stoke.Batch]" in quotes or under `from __future__ import annotations`.)"""

    dataset: Any
    batch_size: int | None
    num_workers: int
    drop_last: bool
    device: str | None
    # A Python dataset: torch's attributes, with torch's meaning (the user's sampler and
    # batch_sampler objects, else torch's SequentialSampler / RandomSampler / BatchSampler;
    # default_collate or default_convert; a multiprocessing context)
    sampler: Any
    batch_sampler: Any
    collate_fn: Callable[..., Any] | None
    prefetch_factor: int | None
    multiprocessing_context: Any

    # A source string: sampler, batch_sampler, collate_fn, worker_init_fn and pad apply to
    # Python datasets only (TypeError); device= ("cuda:1" or a torch.device) to source strings
    # only (ValueError with a Python dataset).  (A str is also a _MapDataset to a type checker,
    # so a source string with collate_fn= is not caught before it runs.)
    @overload
    def __init__(self: "DataLoader[Batch]", dataset: str | os.PathLike[str],
                 batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: None = None,
                 batch_sampler: None = None,
                 num_workers: int | None = None,
                 collate_fn: None = None,
                 pin_memory: bool | None = None, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: None = None,
                 multiprocessing_context: str | Any | None = None,  # "fork" or a context
                 generator: Any | None = None,  # a torch.Generator
                 *, prefetch_factor: int | None = None, persistent_workers: bool | None = None,
                 pin_memory_device: str | None = None, in_order: bool = True,
                 seed: int | None = None,
                 device: str | Any | None = None,
                 distributed: bool = False, rank: int | None = None,
                 world_size: int | None = None,
                 worker_mode: Literal["threads", "processes"] | None = None,
                 arena: str | None = None,
                 pad: None = None,
                 pad_to_multiple_of: int | None = None, max_length: int | None = None,
                 return_lengths: bool = True, max_batch_bytes: int | None = None,
                 structure: Literal["batch"] | None = None,
                 on_error: str | None = None) -> None: ...
    @overload
    def __init__(self: "DataLoader[Any]", dataset: str | os.PathLike[str],
                 batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: None = None,
                 batch_sampler: None = None,
                 num_workers: int | None = None,
                 collate_fn: None = None,
                 pin_memory: bool | None = None, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: None = None,
                 multiprocessing_context: str | Any | None = None,  # "fork" or a context
                 generator: Any | None = None,  # a torch.Generator
                 *, prefetch_factor: int | None = None, persistent_workers: bool | None = None,
                 pin_memory_device: str | None = None, in_order: bool = True,
                 seed: int | None = None,
                 device: str | Any | None = None,
                 distributed: bool = False, rank: int | None = None,
                 world_size: int | None = None,
                 worker_mode: Literal["threads", "processes"] | None = None,
                 arena: str | None = None,
                 pad: None = None,
                 pad_to_multiple_of: int | None = None, max_length: int | None = None,
                 return_lengths: bool = True, max_batch_bytes: int | None = None,
                 structure: Literal["list", "dict"], on_error: str | None = None) -> None: ...
    @overload
    def __init__(self: "DataLoader[Any]", dataset: _MapDataset | Iterable[Any],
                 batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Iterable[int] | None = None,
                 batch_sampler: Iterable[Sequence[int]] | None = None,
                 num_workers: int | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None,
                 pin_memory: bool | None = None, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], object] | None = None,
                 multiprocessing_context: str | Any | None = None,  # "fork" or a context
                 generator: Any | None = None,  # a torch.Generator
                 *, prefetch_factor: int | None = None, persistent_workers: bool | None = None,
                 pin_memory_device: str | None = None, in_order: bool = True,
                 seed: int | None = None,
                 device: None = None,
                 distributed: bool = False, rank: int | None = None,
                 world_size: int | None = None,
                 worker_mode: Literal["threads", "processes"] | None = None,
                 arena: str | None = None,
                 pad: Mapping[str, int | float] | None = None,
                 pad_to_multiple_of: int | None = None, max_length: int | None = None,
                 return_lengths: bool = True, max_batch_bytes: int | None = None,
                 on_error: str | None = None) -> None: ...

    def __iter__(self) -> Iterator[_T_co]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int, /) -> None: ...
    def state_dict(self) -> _LoaderState: ...
    def load_state_dict(self, state: Mapping[str, Any], /) -> None: ...
    def stats(self) -> _LoaderStats: ...
    def quarantine(self, start: int = 0, /) -> list[_BadSample]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def pinned_backend(self) -> str | None: ...
    @property
    def dataset_len(self) -> int | None: ...
    # torch's (its base): warns when num_workers exceeds the CPUs this process may use
    def check_worker_number_rationality(self) -> None: ...


class _BackendInfo(TypedDict):
    name: str
    origin: Literal["builtin", "plugin"]
    available: bool
    device_count: int
    reason: str
    path: str
    caps: int


class _AcceleratorInfo(TypedDict):
    backend: str
    device_count: int
    current_device: int
    reason: str


class _BuildInfo(TypedDict):
    version: str
    liburing: bool
    libjpeg: bool
    libcurl: bool
    check_invariants: bool
    zlib: bool
    simdev_plugin: str | None


def devices() -> list[_BackendInfo]: ...
def accelerator() -> _AcceleratorInfo | None: ...
def pinned_stats() -> dict[str, Any]: ...
def empty_cache() -> None: ...
def build_info() -> _BuildInfo: ...
