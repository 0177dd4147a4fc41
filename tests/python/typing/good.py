"""A user's script, checked with mypy --strict against stoke's stubs (test_typing.py); it is
type-checked, not run.  Every public name of stoke is used here at least once."""
import os
from typing import Any

import stoke


class Squares:
    """A map-style dataset, as torch's Dataset subclasses are."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> tuple[list[float], int]:
        return [float(index)] * 4, index * index


def collate(samples: list[Any]) -> list[Any]:
    return samples


def init_worker(worker_id: int) -> None:
    print("worker", worker_id)


def train() -> int:
    seen = 0
    loader = stoke.DataLoader("npy:train.npy,labels=labels.npy", batch_size=256, shuffle=True,
                              num_workers=4, drop_last=True, seed=0, pin_memory=True,
                              device="cuda", prefetch_factor=2, persistent_workers=True,
                              in_order=False, distributed=True, rank=0, world_size=2,
                              worker_mode="processes", timeout=5.0)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:  # a stoke.Batch: the source is a string
            data: stoke.Field = batch["data"]
            label = batch["label"]
            shape: tuple[int, ...] = data.shape
            seen += len(batch) + shape[0] + label.nbytes + batch.indices.data_ptr()
            seen += batch.epoch + batch.seq + int(batch.is_pinned)
            device_type, device_id = data.__dlpack_device__()
            capsule = data.__dlpack__(stream=None)
            keys: tuple[str, ...] = batch.keys()
            seen += device_type + device_id + len(keys) + batch.data_ptr("label")
            del capsule
    state = loader.state_dict()
    resumed = stoke.DataLoader(os.path.join("data", "x.npy"), batch_size=32)
    resumed.load_state_dict(state)
    seen += state["batches_yielded"] + len(resumed) + resumed.epoch + resumed.rank
    seen += resumed.world_size + resumed.stats()["samples"] + (resumed.dataset_len or 0)
    backend: str | None = resumed.pinned_backend
    print(backend, loader.batch_size, loader.num_workers, loader.drop_last, loader.device)

    torch_like = stoke.DataLoader(Squares(), batch_size=10, shuffle=True, num_workers=2,
                                  collate_fn=collate, worker_init_fn=init_worker,
                                  multiprocessing_context="fork", generator=None,
                                  pin_memory_device="", sampler=None, batch_sampler=None,
                                  pad={"input_ids": 0, "labels": -100}, pad_to_multiple_of=8,
                                  max_length=512, return_lengths=True, max_batch_bytes=1 << 20)
    for sample_batch in torch_like:  # what torch's DataLoader would yield: Any
        seen += len(sample_batch)
    as_dicts = stoke.DataLoader("synthetic:1000", batch_size=50, structure="dict")
    for fields in as_dicts:  # {"data": tensor, "label": tensor}: Any
        seen += len(fields)
    as_batches = stoke.DataLoader("synthetic:1000", structure="batch", arena="auto")
    seen += sum(len(b) for b in as_batches)
    return seen


def report() -> None:
    info = stoke.build_info()
    uring: bool = info["liburing"]
    plugin: str | None = info["simdev_plugin"]
    print(stoke.version, stoke.__version__, info["version"], uring, info["libjpeg"],
          info["check_invariants"], plugin)
    for b in stoke.devices():
        name: str = b["name"]
        print(name, b["available"], b["device_count"], b["reason"], b["origin"], b["caps"])
    acc = stoke.accelerator()
    if acc is not None:
        print(acc["backend"], acc["device_count"], acc["current_device"], acc["reason"])
    print(stoke.pinned_stats().get("bytes_in_use"))
    stoke.empty_cache()
    try:
        train()
    except stoke.LoaderError as e:
        sample: int | None = e.sample
        print(e.code, e.code_name, e.message, sample)
    except stoke.StokeError as e:
        print(e.code)
    w: type[Warning] = stoke.ThreadsWarning
    print(w)


if __name__ == "__main__":
    report()
