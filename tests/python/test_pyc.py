"""The package's bytecode is compiled at build time (python/CMakeLists.txt, stoke_python_pyc):
every module of the stoke package has a .pyc in __pycache__ that is its source's (the build's:
checked-hash, the source's hash; an installed wheel's: pip's, the source's mtime and size), and
a process that cannot write bytecode (PYTHONDONTWRITEBYTECODE) loads each module
from it instead of compiling the source again (12 ms of a DataLoader's constructor for
_dropin.py).  Skips (77) when the extension is not built."""
import glob
import importlib.util
import os
import subprocess
import sys

import stoke_testlib as T

stoke = T.need("stoke")
pkg = os.path.dirname(stoke.__file__)
sources = sorted(glob.glob(os.path.join(pkg, "*.py")))
T.check(any(s.endswith("_dropin.py") for s in sources), "modules: %s" % sources)
for src in sources:
    pyc = importlib.util.cache_from_source(src)
    T.check(os.path.exists(pyc), "%s: no %s" % (src, pyc))
    with open(pyc, "rb") as f:
        head = f.read(16)
    with open(src, "rb") as f:
        want = importlib.util.source_hash(f.read())
    flags = int.from_bytes(head[4:8], "little")
    st = os.stat(src)
    # the build's: flags 0b11, hash-based and checked (the source may change after the build);
    # pip's (a wheel's install compiles its own): flags 0, the source's mtime and size
    valid = head[8:16] == want if flags == 3 else flags == 0 and (
        int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)
    T.check(head[:4] == importlib.util.MAGIC_NUMBER and valid,
            "%s: magic %r flags %d stamp %r, source hash %r" % (pyc, head[:4], flags, head[8:16],
                                                               want))

env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
p = subprocess.run([sys.executable, "-v", "-c", "import stoke, stoke._dropin, stoke.__main__"],
                   capture_output=True, text=True, env=env, timeout=120)
T.check(p.returncode == 0, "import: %s" % p.stderr[-2000:])
for src in sources:
    pyc = importlib.util.cache_from_source(src)
    T.check("# code object from '%s'" % pyc in p.stderr,
            "%s was not loaded from %s: %s" % (src, pyc, [ln for ln in p.stderr.splitlines()
                                                           if os.path.basename(src) in ln]))
print("ok: %d modules from their checked-hash .pyc" % len(sources))
