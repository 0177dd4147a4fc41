"""loader.stats()'s pinned_batches and pageable_batches count where each batch's tensors are
when the caller holds every batch (list(loader)), so that the later ones are copied out of
their blocks: with simdev, the blocks pinned and the pinned pool capped (STOKE_PINNED_LIMIT),
the copies that fall back to ordinary memory count as pageable, the batches in their pinned
blocks and the copies in the pool as pinned, each as stoke_is_pinned says of its tensor (all
20 counted pinned before).  (Copies into the pool from blocks that are not pinned:
test_dropin_iterable_blocks.py.)"""
import os
import warnings

import stoke_testlib as T

torch = T.need("torch")
T.no_forked_python_under_tsan()
T.use_simdev()
os.environ["STOKE_PINNED_LIMIT"] = "6M"  # the held copies' pool: a few batches of 1 MiB
import stoke  # noqa: E402


class Rows:
    """Sample i: 64 KiB of float32, all i; a batch of 16 is 1 MiB."""

    def __len__(self):
        return 320

    def __getitem__(self, i):
        return torch.full((16384,), float(i))


pinned = T.is_pinned_fn()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    loader = stoke.DataLoader(Rows(), batch_size=16, num_workers=2)
    held = list(loader)
st = loader.stats()
T.check(len(held) == 20 and all(torch.equal(b[:, 0], torch.arange(16.0 * k, 16.0 * k + 16))
                                for k, b in enumerate(held)),
        "batches held: %d, values %s" % (len(held), [b[0, 0].item() for b in held]))
where = [pinned(b) for b in held]
T.check(0 < sum(where) < 20 and st["pinned_batches"] == sum(where)
        and st["pageable_batches"] == 20 - sum(where),
        "held batches, the pool capped: pinned %s, counted %s"
        % (where, {k: st[k] for k in ("pinned_batches", "pageable_batches")}))
T.check(any("exceed the pinned memory" in str(m.message) for m in w),
        "the copies past the cap said so: %s" % [str(m.message) for m in w])
print("ok")
