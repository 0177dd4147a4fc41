"""stoke.build_info(): what this installation of stoke was built with."""
import os

from . import _stoke

_SIMDEV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins",
                       "libstoke-backend-simdev.so")


def build_info():
    """A dict: "version" (libstoke's), "liburing" (the npy source's io=uring), "libjpeg" (the
    images: source and .jpg members of tar: shards, libjpeg-turbo), "libcurl" (remote shards,
    tar:http(s)://... and tar:s3://...), "check_invariants" (the
    loader's lifecycle check, Debug builds), "zlib" (CRC-32 of shards in sidecar indexes,
    checked by the shard cache), each True when built in -- optional features follow
    what the build machine had -- and "simdev_plugin": the path of the simulated accelerator
    plugin shipped with the package (for STOKE_PLUGIN_PATH), or None when there is none."""
    info = {"version": _stoke.version}
    info.update(_stoke.build_features())
    info["simdev_plugin"] = _SIMDEV if os.path.isfile(_SIMDEV) else None
    return info
