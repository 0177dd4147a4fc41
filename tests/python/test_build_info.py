"""stoke.build_info(): the version libstoke reports (the CLI's too), and which optional parts
are built in -- as CMake found them when it configured this build (STOKE_BUILD_FEATURES, set
by tests/python/CMakeLists.txt; a wheel's test passes the same) -- and the shipped simdev
plugin, which loads as an accelerator."""
import json
import os
import subprocess
import sys

import stoke_testlib as T

T.need("stoke")
import stoke  # noqa: E402

info = stoke.build_info()
T.check(sorted(info) == ["check_invariants", "libcurl", "libjpeg", "liburing", "simdev_plugin",
                       "version", "zlib"],
        "build_info keys: %s" % sorted(info))
T.check(info["version"] == stoke.version == stoke.__version__, "versions: %s / %s"
        % (info["version"], stoke.version))
for k in ("liburing", "libjpeg", "libcurl", "check_invariants", "zlib"):
    T.check(isinstance(info[k], bool), "%s is not a bool: %r" % (k, info[k]))
want = os.environ.get("STOKE_BUILD_FEATURES")
if want is not None:
    on = {k for k in ("liburing", "libjpeg", "libcurl", "check_invariants", "zlib") if info[k]}
    T.check(on == set(filter(None, want.split(","))),
            "built in: %s; CMake configured: %r" % (sorted(on), want))
cli = os.environ.get("STOKE_CLI")
if cli and os.path.exists(cli):
    out = subprocess.run([cli, "version", "--json"], capture_output=True, text=True).stdout
    T.check(json.loads(out)["version"] == info["version"], "CLI: %s" % out)

plugin = info["simdev_plugin"]
if plugin is not None:  # an installed package: the plugin is usable as it is
    T.check(os.path.isfile(plugin), "simdev_plugin %r is not a file" % plugin)
    code = "import stoke; a = stoke.accelerator(); print(a and a['backend'])"
    env = dict(os.environ, STOKE_PLUGIN_PATH=plugin, STOKE_ACCELERATOR="simdev")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    T.check(p.stdout.strip() == "simdev", "with the shipped plugin: %r %r" % (p.stdout, p.stderr))
print("build_info:", info)
