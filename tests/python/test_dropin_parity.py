"""stoke.DataLoader against torch.utils.data.DataLoader where a review found them apart (issue
27's drop-in): each case runs the same dataset through both loaders, at 0 and 2 workers, and
compares what comes out (values, types) or what is raised (type, message)."""
import stoke_testlib as T

T.no_forked_python_under_tsan()

import dropin_lib as L  # noqa: E402

torch = L.torch


def outcome(make, nw, **kw):
    """The batches of one pass as lists, or (exception type, its message's first line)."""
    try:
        return [b.tolist() for b in make(nw, **kw)]
    except Exception as e:  # noqa: BLE001 - compared with torch's
        return (type(e), str(e).splitlines()[0] if str(e) else "")


@L.case
def plain_iterator_is_map_style():
    """A dataset that is no IterableDataset is map-style in torch, a generator object too:
    len() raises its TypeError.  stoke iterated it, each worker process its own copy (every
    item once per worker)."""
    def gen():
        for i in range(6):
            yield torch.tensor(i)

    for nw in (0, 2):
        for what, make in (("generator", gen), ("list_iterator", lambda: iter([1, 2, 3, 4]))):
            ref = outcome(lambda n: L.TorchLoader(make(), batch_size=2, num_workers=n), nw)
            got = outcome(lambda n: L.Loader(make(), batch_size=2, num_workers=n), nw)
            T.check(ref == (TypeError, "object of type '%s' has no len()" % what),
                    "torch %s workers=%d: %r" % (what, nw, ref))
            T.check(got == ref, "%s workers=%d: stoke %r, torch %r" % (what, nw, got, ref))


L.run_cases()
