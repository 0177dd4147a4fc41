"""A Python dataset returning what stoke cannot collate (a dict, a str or None, as the sample or
as a field, also nested in a tuple field; a NumPy array of objects or of text) raises a
TypeError naming the sample, the field path and the type: at construction for sample 0, from
iteration for a later one.  (Before: a batch of one raw field of PyObject pointers.)"""
import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

N, BAD = 16, 3
GOOD = (np.arange(4, dtype=np.float32), np.int64(1))


class DS:
    def __init__(self, bad, good=GOOD, at=BAD):
        self.bad, self.good, self.at = bad, good, at

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.bad if i == self.at else self.good


def expect_type_error(ds, words, at):
    """Constructs and iterates a loader over ds: a TypeError with every word in its message
    (and, from iteration, a note naming the sample); no batch may be delivered past it."""
    got = []
    try:
        loader = stoke.DataLoader(ds, batch_size=2, num_workers=2, pin_memory=False)
        T.check(at != 0, "%r: sample 0 accepted at construction" % (words,))
        for b in loader:
            got.append(b.keys())
            del b
    except TypeError as e:
        msg = str(e)
        for w in words:
            T.check(w in msg, "%r lacks %r" % (msg, w))
        T.check("not supported" in msg, msg)
        if at != 0:
            notes = getattr(e, "__notes__", [])
            T.check(any("sample %d" % at in n for n in notes), "notes %s" % notes)
        T.check(len(got) <= at // 2, "%d batch(es) delivered before sample %d: %s"
                % (len(got), at, got))
        return
    except Exception as e:  # noqa: BLE001
        T.check(False, "%r: %s: %s, not a TypeError" % (words, type(e).__name__, e))
    T.check(False, "%r: no error; batches %s" % (words, got))


arr = np.arange(4, dtype=np.float32)
cases = [
    # (what sample BAD returns, words in the message)
    ({"data": arr}, ["sample 3:", "dict"]),
    ("a string", ["sample 3:", "str"]),
    (None, ["sample 3:", "NoneType"]),
    ((arr, {"y": 1}), ["sample 3, field 1:", "dict"]),
    ((arr, "label"), ["sample 3, field 1:", "str"]),
    ((arr, None), ["sample 3, field 1:", "NoneType"]),
    ((None, np.int64(1)), ["sample 3, field 0:", "NoneType"]),
    ((arr, np.array([None, 1], dtype=object)), ["sample 3, field 1:", "ndarray", "'O'"]),
    ((arr, np.array(["ab", "cd"])), ["sample 3, field 1:", "ndarray", "w'"]),
]
for bad, words in cases:
    expect_type_error(DS(bad), words, BAD)
    expect_type_error(DS(bad, at=0), [w.replace("sample 3", "sample 0") for w in words], 0)

# nested: field 1 is a pair of arrays in sample 0 (stacked by numpy.asarray: shape (2, 2))
pair = (arr, (np.zeros(2), np.ones(2)))
for inner, name in (({"k": 1}, "dict"), ("s", "str"), (None, "NoneType")):
    bad = (arr, (np.zeros(2), inner))
    expect_type_error(DS(bad, good=pair), ["sample 3, field 1[1]:", name], BAD)
    expect_type_error(DS(bad, good=pair, at=0), ["sample 0, field 1[1]:", name], 0)
    deep = (arr, [np.zeros(2), [1.0, inner]])  # a list inside the tuple field
    expect_type_error(DS(deep, good=pair), ["sample 3, field 1[1][1]:", name], BAD)

# not a regression: the supported kinds still load (arrays, NumPy scalars, numbers, nested
# tuples of numbers)
ok = (arr, np.int64(5), 2.5, (1, 2))
loader = stoke.DataLoader(DS(ok, good=ok), batch_size=4, num_workers=2, pin_memory=False)
n = 0
for b in loader:
    T.check(np.array_equal(np.asarray(b["data"])[0], arr), "data")
    T.check(list(np.asarray(b["label"])) == [5] * len(b), "label")
    T.check(list(np.asarray(b["field2"])) == [2.5] * len(b), "field2")
    T.check(np.asarray(b["field3"]).shape == (len(b), 2), "field3")
    n += len(b)
    del b
T.check(n == N, "samples %d" % n)
print("ok")
