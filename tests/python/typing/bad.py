"""Mistakes the stubs must catch: test_typing.py runs mypy --strict on this file and expects an
error on every line marked `# error`, and on no other line."""
import stoke

loader = stoke.DataLoader("npy:x.npy", batch_size=256)
stoke.DataLoader("npy:x.npy", batch_size="256")  # error
stoke.DataLoader("npy:x.npy", 64, True, None, None, 2, None, None, False, 0, None, None, None, 2)  # error
stoke.DataLoader("npy:x.npy", worker_mode="forks")  # error
stoke.DataLoader(42)  # error
stoke.DataLoader([1, 2, 3], device="cuda")  # error
stoke.DataLoader([1, 2, 3], structure="dict")  # error
stoke.DataLoader("npy:x.npy", structure="tuple")  # error
loader.set_epoch("1")  # error
for batch in loader:
    batch["data"].shape.append(3)  # error
    name: int = batch.keys()[0]  # error
info = stoke.build_info()
print(info["cuda"])  # error
uring: str = info["liburing"]  # error
acc = stoke.accelerator()
print(acc["backend"])  # error
stoke.empty_cache(True)  # error
stoke.no_such_function()  # error
