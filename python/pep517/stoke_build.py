"""stoke's PEP 517 build backend: CMake builds libstoke and the extension, this file writes the
wheel (and the sdist).  No dependency beyond Python itself (and tomli before Python 3.11), so
`pip install --no-build-isolation .` works offline; docs/development.md says why it is in-tree.

The wheel holds the package `stoke`: python/stoke/*.py, *.pyi and py.typed; the extension
_stoke (built with STOKE_PYTHON_WHEEL=ON: it finds libstoke in its own folder, RPATH $ORIGIN);
libstoke.so.MAJOR beside it; the simdev plugin under stoke/plugins/.  The optional features
(liburing, libjpeg-turbo) are what this machine has; stoke.build_info() says which.

config_settings (pip install -C KEY=VALUE ., python3 -m build -C KEY=VALUE):
  build-dir   the CMake build directory, kept (default: a temporary one, removed afterwards)
  build-type  CMAKE_BUILD_TYPE (default: RelWithDebInfo, the project's own default)
  cmake-args  more configure arguments, split as a shell splits them
Environment: CMAKE (the cmake to run, default `cmake`), CMAKE_BUILD_PARALLEL_LEVEL (jobs,
default: the CPUs this process may use).
"""
import base64
import hashlib
import importlib.machinery
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

ROOT = os.getcwd()  # PEP 517: hooks run in the source tree
_EPOCH_1980 = 315532800  # the earliest time a zip entry can carry


def _stamp():
    """The time of every wheel entry: SOURCE_DATE_EPOCH, else 1980 (a reproducible wheel)."""
    return time.gmtime(max(_EPOCH_1980, int(os.environ.get("SOURCE_DATE_EPOCH", _EPOCH_1980))))[:6]


def _toml():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    return tomllib


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return _toml().load(f)["project"]


def _version():
    """The library's version (include/stoke/version.h), which stoke.version reports too."""
    with open(os.path.join(ROOT, "include", "stoke", "version.h")) as f:
        m = re.search(r'#define STOKE_VERSION_STRING "([^"]+)"', f.read())
    if not m:
        raise RuntimeError("stoke_build: no STOKE_VERSION_STRING in include/stoke/version.h")
    return m.group(1)


def _name():
    return re.sub(r"[-_.]+", "_", _project()["name"]).lower()


def _metadata():
    """Core metadata 2.1 (PKG-INFO / METADATA) from pyproject.toml's [project]."""
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + _version()]
    if "description" in p:
        lines.append("Summary: " + p["description"])
    if "requires-python" in p:
        lines.append("Requires-Python: " + p["requires-python"])
    lic = p.get("license", {})
    if "text" in lic:
        lines.append("License: " + lic["text"])
    for k, v in sorted(p.get("urls", {}).items()):
        lines.append("Project-URL: %s, %s" % (k, v))
    for c in p.get("classifiers", []):
        lines.append("Classifier: " + c)
    for d in p.get("dependencies", []):
        lines.append("Requires-Dist: " + d)
    for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: " + extra)
        for d in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (d, extra))
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _tag():
    """cp311-cp311-linux_x86_64: this interpreter, its ABI, this platform (a wheel built here,
    for machines like this one: no manylinux promise)."""
    if sys.implementation.name != "cpython":
        raise RuntimeError("stoke_build: only CPython is supported, not " + sys.implementation.name)
    py = "cp%d%d" % sys.version_info[:2]
    soabi = sysconfig.get_config_var("SOABI") or ""  # cpython-311-x86_64-linux-gnu
    abi = "cp" + soabi.split("-")[1] if soabi.startswith("cpython-") else py
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (py, abi, plat)


def _dist_info():
    return "%s-%s.dist-info" % (_name(), _version())


def _wheel_file():
    return "Wheel-Version: 1.0\nGenerator: stoke_build\nRoot-Is-Purelib: false\nTag: %s\n" % _tag()


def _log(msg):
    print("stoke_build: " + msg, file=sys.stderr, flush=True)


def _run(cmd):
    _log(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True, cwd=ROOT)


# ---- PEP 517 hooks ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return [] if sys.version_info >= (3, 11) else ["tomli"]


def get_requires_for_build_sdist(config_settings=None):
    return get_requires_for_build_wheel(config_settings)


# The `stoke` command of the installed package: the same tool as `python -m stoke` (the C CLI).
ENTRY_POINTS = "[console_scripts]\nstoke = stoke.__main__:cli\n"


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(_wheel_file())
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(ENTRY_POINTS)
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    cs = config_settings or {}
    keep = cs.get("build-dir")
    bdir = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="stoke-wheel-")
    try:
        _cmake(bdir, cs)
        files = _package_files(bdir)
        name = "%s-%s-%s.whl" % (_name(), _version(), _tag())
        _write_wheel(os.path.join(wheel_directory, name), files)
    finally:
        if not keep:
            shutil.rmtree(bdir, ignore_errors=True)
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (_name(), _version())
    name = base + ".tar.gz"
    pkg_info = _metadata()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))  # of PKG-INFO
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in _source_files():
            t.add(os.path.join(ROOT, rel), arcname=base + "/" + rel, recursive=False)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size, info.mtime, info.mode = len(pkg_info), mtime, 0o644
        t.addfile(info, io.BytesIO(pkg_info))
    return name


# ---- the build -------------------------------------------------------------------------------

def _cmake(bdir, cs):
    cmake = os.environ.get("CMAKE", "cmake")
    if shutil.which(cmake) is None:
        raise RuntimeError("stoke_build: cmake not found (Debian: apt-get install cmake gcc make)")
    cfg = [cmake, "-S", ROOT, "-B", bdir,
           "-DCMAKE_BUILD_TYPE=" + cs.get("build-type", "RelWithDebInfo"),
           "-DSTOKE_BUILD_TESTS=OFF", "-DSTOKE_PYTHON=ON", "-DSTOKE_PYTHON_WHEEL=ON",
           "-DPython3_EXECUTABLE=" + sys.executable]
    cfg += shlex.split(cs.get("cmake-args", ""))
    _run(cfg)
    build = [cmake, "--build", bdir, "--target", "stoke_python", "stoke-backend-simdev"]
    if not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        build += ["-j", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else os.cpu_count() or 1)]
    _run(build)


def _package_files(bdir):
    """[(path in the wheel, file on disk, executable)] of the package stoke."""
    src = os.path.join(ROOT, "python", "stoke")
    out = []
    for f in sorted(os.listdir(src)):
        if f.endswith((".py", ".pyi")) or f == "py.typed":
            out.append(("stoke/" + f, os.path.join(src, f), False))
    ext = "_stoke" + importlib.machinery.EXTENSION_SUFFIXES[0]
    built = os.path.join(bdir, "python", "stoke", ext)
    if not os.path.isfile(built):
        raise RuntimeError("stoke_build: the build made no %s (for %s)" % (built, sys.executable))
    out.append(("stoke/" + ext, built, True))
    soname = "libstoke.so.%s" % _version().split(".")[0]
    lib = os.path.realpath(os.path.join(bdir, soname))  # libstoke.so.0 -> libstoke.so.0.1.0
    if not os.path.isfile(lib):
        raise RuntimeError("stoke_build: the build made no %s" % os.path.join(bdir, soname))
    out.append(("stoke/" + soname, lib, True))
    simdev = os.path.join(bdir, "plugins", "libstoke-backend-simdev.so")
    if os.path.isfile(simdev):
        out.append(("stoke/plugins/libstoke-backend-simdev.so", simdev, True))
    return out


def _write_wheel(path, files):
    di = _dist_info()
    meta = [(di + "/METADATA", _metadata()), (di + "/WHEEL", _wheel_file().encode()),
            (di + "/entry_points.txt", ENTRY_POINTS.encode())]
    record = []
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data, mode):
            zi = zipfile.ZipInfo(arc, _stamp())
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append("%s,sha256=%s,%d" % (arc, digest.decode(), len(data)))
        for arc, disk, exe in files:
            with open(disk, "rb") as f:
                add(arc, f.read(), 0o755 if exe else 0o644)
        for arc, data in meta:
            add(arc, data, 0o644)
        record.append(di + "/RECORD,,")
        zi = zipfile.ZipInfo(di + "/RECORD", _stamp())
        zi.external_attr = (0o100000 | 0o644) << 16
        z.writestr(zi, "\n".join(record) + "\n")
    os.replace(tmp, path)


def _source_files():
    """The sdist's files: git's tracked and not-ignored ones, else the tree less build output."""
    if os.path.isdir(os.path.join(ROOT, ".git")) or os.path.isfile(os.path.join(ROOT, ".git")):
        try:
            out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                  "--exclude-standard"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
            return sorted(f for f in set(out.decode().split("\0"))
                          if f and os.path.isfile(os.path.join(ROOT, f)))
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for d, dirs, names in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        dirs[:] = sorted(x for x in dirs if not (x.startswith("build") and rel == ".")
                         and x not in (".git", "__pycache__"))
        for n in names:
            if not n.endswith((".pyc", ".o", ".so")) and n != "PKG-INFO":
                files.append(os.path.normpath(os.path.join(rel, n)))
    return sorted(files)
