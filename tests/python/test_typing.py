"""The type stubs (stoke/__init__.pyi, py.typed): mypy --strict accepts typing/good.py, a user's
script that uses every public name, and reports exactly the mistakes marked in typing/bad.py
(each marked line, no other); every public name of the package -- stoke.__all__, the public
attributes of DataLoader, Batch and Field -- is in the stub, and every name the stub's __all__
lists exists.  Checks the stoke that is imported: the build tree's (MYPYPATH) or an installed
one (found by mypy through py.typed, as a user's mypy finds it)."""
import ast
import os
import re
import subprocess
import sys

import stoke_testlib as T

T.need("mypy")
import stoke  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.abspath(stoke.__file__))
STUB = os.path.join(PKG, "__init__.pyi")
T.check(os.path.isfile(STUB), "no stub %s" % STUB)
T.check(os.path.isfile(os.path.join(PKG, "py.typed")), "no py.typed in %s" % PKG)

# ---- every public name is in the stub ---------------------------------------------------------
tree = ast.parse(open(STUB).read())
top, members, stub_all = set(), {}, None
for node in tree.body:
    if isinstance(node, ast.ClassDef):
        top.add(node.name)
        names = set()
        for m in node.body:
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(m.name)
            elif isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name):
                names.add(m.target.id)
        members[node.name] = names
    elif isinstance(node, ast.FunctionDef):
        top.add(node.name)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        top.add(node.target.id)
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Name):
                top.add(t.id)
                if t.id == "__all__":
                    stub_all = ast.literal_eval(node.value)
T.check(stub_all is not None, "the stub has no __all__")
missing = sorted(set(stoke.__all__) - top)
T.check(not missing, "public names without a stub: %s" % missing)
T.check(sorted(stub_all) == sorted(stoke.__all__),
        "__all__ differs: stub %s, package %s" % (sorted(stub_all), sorted(stoke.__all__)))
for name in stub_all:
    T.check(hasattr(stoke, name), "the stub lists stoke.%s, which does not exist" % name)
for cls in ("DataLoader", "Batch", "Field"):
    public = {a for a in dir(getattr(stoke, cls)) if not a.startswith("_")}
    missing = sorted(public - members[cls])
    T.check(not missing, "stoke.%s: public attributes without a stub: %s" % (cls, missing))


# ---- mypy --strict ----------------------------------------------------------------------------
def mypy(path):
    env = dict(os.environ)
    site = os.sep + "site-packages" + os.sep in PKG or os.sep + "dist-packages" + os.sep in PKG
    if not site:  # the build tree: found through MYPYPATH; an installed one: through py.typed
        env["MYPYPATH"] = os.path.dirname(PKG)
    else:
        env.pop("MYPYPATH", None)
    cache = os.path.join(T.tmpdir(), "mypy-cache")
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", cache,
                        "--python-executable", sys.executable, "--hide-error-context",
                        "--no-error-summary", "--no-color-output", path],
                       env=env, cwd=os.path.dirname(path), capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


rc, out = mypy(os.path.join(HERE, "typing", "good.py"))
T.check(rc == 0, "mypy --strict rejects typing/good.py:\n" + out)

bad = os.path.join(HERE, "typing", "bad.py")
want = {i + 1 for i, line in enumerate(open(bad)) if line.rstrip().endswith("# error")}
rc, out = mypy(bad)
got = {int(m.group(1)) for m in re.finditer(r"^bad\.py:(\d+): error:", out, re.M)}
T.check(rc == 1 and want and got == want,
        "typing/bad.py: mypy reported errors on lines %s, the marked lines are %s:\n%s"
        % (sorted(got), sorted(want), out))
print("stub covers %d public names; mypy --strict: good.py clean, bad.py %d errors as marked"
      % (len(stoke.__all__), len(want)))
