"""prefetch_factor: None (the default, as in PyTorch) is the loader's auto — a deeper window of
small batch buffers with worker threads (1 MiB of them, at most 256, + 2) — while an explicit
number is kept (prefetch_factor x workers + 2), and both deliver the same batches."""
import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

data, labels, dp, lp = T.make_npy(np, n=300, row_floats=16)


def run(**kw):
    loader = stoke.DataLoader("npy:" + dp, batch_size=1, shuffle=True, seed=9, num_workers=2,
                              pin_memory=False, **kw)
    idx = [int(np.from_dlpack(b.indices)[0]) for b in loader]
    st = loader.stats()
    del loader
    return idx, st["buffers"], st["buffer_bytes"]


auto_idx, auto_n, nbytes = run()
two_idx, two_n, _ = run(prefetch_factor=2)
want = min(256, (1 << 20) // nbytes) + 2
T.check(auto_n == want, "default: %d buffers of %d bytes, want %d" % (auto_n, nbytes, want))
T.check(two_n == 2 * 2 + 2, "prefetch_factor=2: %d buffers" % two_n)
T.check(auto_idx == two_idx and sorted(auto_idx) == list(range(300)), "batches differ")
print("ok")
