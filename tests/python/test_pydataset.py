"""A Python map-style dataset run by 2 worker threads delivers the same batches (indices,
rows, labels) as the same data read from .npy by the C source."""
import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=150, row_floats=100)


class Rows:
    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        return data[i], labels[i]  # a row and a NumPy scalar label


def batches(source):
    out = []
    loader = stoke.DataLoader(source, batch_size=16, shuffle=True, seed=11, num_workers=2,
                              pin_memory=False)
    T.check(len(loader) == 10, "len %d" % len(loader))
    for b in loader:
        T.check(b.keys() == ("data", "label"), "fields %s" % (b.keys(),))
        out.append((np.from_dlpack(b.indices).copy(), np.asarray(b["data"]).copy(),
                    np.asarray(b["label"]).copy()))
    return out


py = batches(Rows())
npy = batches("npy:%s,labels=%s" % (dp, lp))
T.check(len(py) == len(npy) == 10, "batches %d %d" % (len(py), len(npy)))
for (pi, pd, pl), (ni, nd, nl) in zip(py, npy):
    T.check(np.array_equal(pi, ni), "order differs: %s %s" % (pi, ni))
    T.check(pd.dtype == nd.dtype and np.array_equal(pd, nd), "rows differ at %s" % pi)
    T.check(np.array_equal(pl, nl) and np.array_equal(pd, data[pi]), "labels differ at %s" % pi)
print("ok")
