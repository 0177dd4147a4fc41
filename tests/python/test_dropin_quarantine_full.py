"""on_error past the quarantine's last entry (STOKE_QUARANTINE_MAX, 65,536): every bad batch up
to it has its own RuntimeWarning, then one warning says that later ones are only counted; stats()
counts them all, so no skipped batch goes unreported."""
import warnings

import stoke_testlib as T

torch = T.need("torch")
import stoke  # noqa: E402

MAX = stoke._stoke.QUARANTINE_MAX
EXTRA = 5


class AllBad:
    """MAX + EXTRA samples; every one but sample 0 raises."""

    def __len__(self):
        return MAX + EXTRA + 1

    def __getitem__(self, i):
        if i:
            raise ValueError("bad %d" % i)
        return torch.tensor([i])


with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    loader = stoke.DataLoader(AllBad(), batch_size=1, on_error="skip")
    got = [b.tolist() for b in loader]
    msgs = [str(w.message) for w in ws if issubclass(w.category, RuntimeWarning)]
T.check(got == [[[0]]], "batches: %r" % got[:4])
each = [m for m in msgs if " skipped (on_error=" in m]
full = [m for m in msgs if "not warned about one by one" in m]
T.check(len(each) == MAX, "%d warnings for single batches, want %d" % (len(each), MAX))
T.check(each[0].startswith("stoke: batch 1 of epoch 0 skipped") and "bad 1" in each[0],
        "first warning: %s" % each[0])
T.check(len(full) == 1 and ("more than %d batches" % MAX) in full[0],
        "the quarantine-full warning: %r" % full)
s = loader.stats()
T.check(s["bad_samples"] == MAX + EXTRA and s["skipped_samples"] == MAX + EXTRA,
        "stats: %r" % {k: s[k] for k in ("bad_samples", "skipped_samples")})
print("ok")
