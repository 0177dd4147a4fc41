"""Errors and warnings: the no-accelerator warning is one Python UserWarning, only when
pin_memory=True was asked for (stoke's default, like torch's, does not warn); a bad sample is a
stoke.LoaderError naming the sample; an exception raised by __getitem__ reaches the caller as
itself, with its traceback."""
import os
import traceback
import warnings

import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

# 1. the warning (no accelerator here: STOKE_ACCELERATOR and STOKE_PLUGIN_PATH empty): none by
#    default (the user never asked for pinning), once with pin_memory=True
if stoke.accelerator() is not None:
    T.skip("an accelerator is present: no pin_memory warning to check")
with warnings.catch_warnings():
    warnings.simplefilter("error")
    for _ in stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0):
        pass
    for _ in stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=2):
        pass
    stoke.DataLoader("synthetic:10,shape=4", pin_memory=False, num_workers=0)
    _stoke = stoke._stoke
    _stoke.flush_warnings()  # anything logged in worker threads
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0, pin_memory=True)
    b = stoke.DataLoader("synthetic:10,shape=4", batch_size=2, num_workers=0, pin_memory=True)
    for _ in a:
        pass
    for _ in b:
        pass
msgs = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
pin = [m for m in msgs if "pin_memory is set but no accelerator" in m]
T.check(len(pin) == 1, "pin_memory warnings: %s" % msgs)
T.check(a.pinned_backend is None, "pinned for %r without an accelerator" % a.pinned_backend)


# 2. a sample of the wrong shape: LoaderError with the index and the dataset's message
class Ragged:
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return np.zeros(5 if i == 13 else 4, dtype=np.float32)


try:
    for _ in stoke.DataLoader(Ragged(), batch_size=4, num_workers=2, pin_memory=False):
        pass
    T.check(False, "a ragged sample raised nothing")
except stoke.LoaderError as e:
    T.check(e.sample == 13, "sample %r: %s" % (e.sample, e))
    T.check("sample 13" in str(e) and "shape" in str(e), "message: %s" % e)
    T.check(e.code_name == "STOKE_EDATA", "code %s" % e.code_name)

# 3. a .npy that shrank under the loader: the sample past the end, the file named
data, labels, dp, lp = T.make_npy(np, n=64)
loader = stoke.DataLoader("npy:%s,io=pread" % dp, batch_size=8, num_workers=0, pin_memory=False)
os.truncate(dp, os.path.getsize(dp) - 20 * 768 * 4)
try:
    for _ in loader:
        pass
    T.check(False, "a truncated file raised nothing")
except stoke.LoaderError as e:
    T.check(e.sample == 0 and "changed while loading" in str(e), "sample %r: %s" % (e.sample, e))
    T.check(dp in str(e), "message does not name the file: %s" % e)


# 4. __getitem__ raising: the same exception, its traceback through __getitem__
class Failing:
    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == 7:
            raise ValueError("row 7 is corrupt")
        return np.full(3, i, dtype=np.int32)


for workers in (0, 2):
    try:
        for _ in stoke.DataLoader(Failing(), batch_size=4, num_workers=workers, pin_memory=False):
            pass
        T.check(False, "the raising __getitem__ raised nothing")
    except ValueError as e:
        T.check(str(e) == "row 7 is corrupt", "message %s" % e)
        frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
        T.check("__getitem__" in frames, "traceback lost: %s" % frames)
        notes = getattr(e, "__notes__", [])
        T.check(any("sample 7" in n for n in notes), "notes %s" % notes)
_ = None  # no batch (and so no loader) left alive at exit
print("ok")
