"""state_dict()/load_state_dict() resume mid-epoch: a new loader given the state delivers the
same remaining batches as the uninterrupted run; iterating again starts the next epoch, and
set_epoch starts a given one."""
import stoke_testlib as T

np = T.need("numpy")
import stoke  # noqa: E402

SPEC = "synthetic:103,shape=8"


def make():
    return stoke.DataLoader(SPEC, batch_size=4, shuffle=True, seed=3, num_workers=2,
                            pin_memory=False)


def order(loader):
    return [np.from_dlpack(b.indices).tolist() for b in loader]


full = order(make())
T.check(len(full) == 26 and sorted(sum(full, [])) == list(range(103)), "epoch 0: %s" % full)
for k in (0, 1, 9, 25, 26):
    a = make()
    it = iter(a)
    head = [np.from_dlpack(next(it).indices).tolist() for _ in range(k)]
    state = a.state_dict()
    T.check(state["batches_yielded"] == k and state["epoch"] == 0, "state %s" % state)
    rest_a = [np.from_dlpack(b.indices).tolist() for b in it]
    b = make()
    b.load_state_dict(state)
    rest_b = order(b)
    if k == len(full):
        # the epoch's end resumes at the start of the next epoch, as the saving loader's next
        # pass (StatefulDataLoader's rule), not with an empty pass
        next_a = order(a)
        T.check(b.epoch == 1 and rest_b == next_a and rest_b != full,
                "resume at the end: epoch %d %s, want epoch 1 %s" % (b.epoch, rest_b, next_a))
        continue
    T.check(head + rest_b == full, "resume at %d: %s" % (k, rest_b))
    T.check(rest_a == rest_b, "resume at %d differs from the uninterrupted run" % k)

# A second pass is the next epoch (another order); set_epoch(0) replays epoch 0.
c = make()
e0 = order(c)
e1 = order(c)
T.check(c.epoch == 1 and e1 != e0 and sorted(sum(e1, [])) == list(range(103)), "epoch 1")
c.set_epoch(0)
T.check(order(c) == e0, "set_epoch(0) did not replay epoch 0")
print("ok")
