#!/bin/sh
# Installs the build in BUILD_DIR into a scratch prefix and builds a consumer against it twice:
# through pkg-config (shared and static) and through the CMake package config.
set -eu
build="${1:-build}"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib/$(gcc -print-multiarch 2>/dev/null)/pkgconfig"
src="$(cd "$(dirname "$0")/../tests/install" && pwd)"
cc -o "$prefix/consumer-shared" "$src/consumer.c" $(pkg-config --cflags --libs stoke) -Wl,-rpath,"$(pkg-config --variable=libdir stoke)"
"$prefix/consumer-shared"
cc -o "$prefix/consumer-static" "$src/consumer.c" $(pkg-config --cflags stoke) "$(pkg-config --variable=libdir stoke)/libstoke.a" $(pkg-config --libs-only-l --static stoke | sed 's/-lstoke//')
"$prefix/consumer-static"
cmake -S "$src" -B "$prefix/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/cmake-build" >/dev/null
LD_LIBRARY_PATH="$(pkg-config --variable=libdir stoke)" "$prefix/cmake-build/consumer"
"$prefix/bin/stoke" devices --json >/dev/null
STOKE_PLUGIN_PATH="$(pkg-config --variable=libdir stoke)/stoke/libstoke-backend-simdev.so" \
    "$prefix/bin/stoke" devices --json | grep -q '"backend": "simdev"'
echo "install check: pkg-config (shared, static), CMake package config, installed CLI and simdev plugin work"
