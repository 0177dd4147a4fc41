"""stoke.build_info(): what this installation of stoke was built with."""
import os

from . import _stoke

_HERE = os.path.dirname(os.path.abspath(__file__))
_PLUGIN = "libstoke-backend-simdev.so"
# where each kind of installation keeps the plugin: a wheel beside the package; `make install`
# in PREFIX/lib/stoke (the package in PREFIX/lib/pythonX.Y/dist-packages/stoke); the build
# tree in build/plugins (the package in build/python/stoke)
_SIMDEV = [os.path.join(_HERE, "plugins", _PLUGIN),
           os.path.normpath(os.path.join(_HERE, "..", "..", "..", "stoke", _PLUGIN)),
           os.path.normpath(os.path.join(_HERE, "..", "..", "plugins", _PLUGIN))]


def build_info():
    """A dict: "version" (libstoke's), "liburing" (the npy source's io=uring), "libjpeg" (the
    images: source and .jpg members of tar: shards, libjpeg-turbo), "libcurl" (remote shards,
    tar:http(s)://... and tar:s3://...), "check_invariants" (the
    loader's lifecycle check, Debug builds), "zlib" (CRC-32 of shards in sidecar indexes,
    checked by the shard cache), each True when built in -- optional features follow
    what the build machine had -- and "simdev_plugin": the path of the simulated accelerator
    plugin installed with the package (a wheel's, `make install`'s, the build tree's; for
    STOKE_PLUGIN_PATH), or None when there is none."""
    info = {"version": _stoke.version}
    info.update(_stoke.build_features())
    info["simdev_plugin"] = next((p for p in _SIMDEV if os.path.isfile(p)), None)
    return info
