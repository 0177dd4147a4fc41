#!/bin/sh
# Installs the build in BUILD_DIR (default build) into a scratch prefix with `make install
# PREFIX=DIR`, as a user would after `make test` or `make demo`, and checks that everything lands
# there; then builds a consumer against it: through pkg-config (shared, run without
# LD_LIBRARY_PATH; static, from a prefix holding only libstoke.a) and through the CMake package
# config; then runs the installed CLI and simdev plugin.
set -eu
build="${1:-build}"
root="$(cd "$(dirname "$0")/.." && pwd)"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "check-install: $*" >&2; exit 1; }

# stoke.pc's Libs.private from a CMake list of link items (cmake/stoke_pc_flags.cmake)
flags=$(cmake -DITEMS="-L/usr/lib/x86_64-linux-gnu;-luring;/opt/j/lib/libjpeg.so;/opt/j/lib/libz.a;m" \
    -DIMPLICIT="/usr/lib/x86_64-linux-gnu" -P "$root/cmake/stoke_pc_flags.cmake" 2>&1)
[ "$flags" = "-luring -L/opt/j/lib -ljpeg -lz -lm" ] || fail "stoke_pc_flags gave '$flags'"

# make install PREFIX=DIR: PREFIX wins over the prefix the existing build was configured with
[ -f "$build/CMakeCache.txt" ] || fail "$build is not a configured build (run make test first)"
make -s -C "$root" install BUILD="$build" PREFIX="$prefix" >/dev/null
[ -x "$prefix/bin/stoke" ] || fail "make install PREFIX=$prefix installed no $prefix/bin/stoke"
[ -f "$prefix/include/stoke/stoke.h" ] || fail "no $prefix/include/stoke/stoke.h"
pc=$(find "$prefix" -name stoke.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "make install PREFIX=$prefix installed no stoke.pc"
export PKG_CONFIG_PATH="$(dirname "$pc")"
libdir=$(pkg-config --variable=libdir stoke)
[ -f "$libdir/libstoke.a" ] || fail "no static library $libdir/libstoke.a"
ls "$libdir"/libstoke.so* >/dev/null 2>&1 || fail "no shared library in $libdir"

# Libs.private: separate flags, no CMake list separators
static_libs=$(pkg-config --static --libs stoke)
case "$static_libs" in *";"*) fail "pkg-config --static --libs stoke: a CMake list: $static_libs" ;; esac
for f in $static_libs; do
    case "$f" in -*) ;; *) fail "pkg-config --static --libs stoke: '$f' is not a flag" ;; esac
done

src="$root/tests/install"
# shared, through pkg-config only: runs without LD_LIBRARY_PATH (the .pc's rpath)
cc -o "$prefix/consumer-shared" "$src/consumer.c" $(pkg-config --cflags --libs stoke)
env -u LD_LIBRARY_PATH "$prefix/consumer-shared" >/dev/null ||
    fail "a program linked with pkg-config --libs stoke does not run without LD_LIBRARY_PATH"

# static, through pkg-config --static only: a copy of the prefix without the shared library
# (stoke.pc is relocatable), so that -lstoke is libstoke.a
st="$prefix/static"
mkdir -p "$st/lib/pkgconfig"
cp -r "$prefix/include" "$st/"
cp "$libdir/libstoke.a" "$st/lib/"
sed 's|^libdir=.*|libdir=${prefix}/lib|' "$pc" >"$st/lib/pkgconfig/stoke.pc"
cc -o "$prefix/consumer-static" "$src/consumer.c" \
    $(PKG_CONFIG_PATH="$st/lib/pkgconfig" pkg-config --cflags --static --libs stoke)
if readelf -d "$prefix/consumer-static" | grep -q 'NEEDED.*libstoke'; then
    fail "consumer-static needs the shared libstoke"
fi
env -u LD_LIBRARY_PATH "$prefix/consumer-static" >/dev/null

# the CMake package config
cmake -S "$src" -B "$prefix/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/cmake-build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/cmake-build/consumer" >/dev/null

# the installed CLI and plugin
"$prefix/bin/stoke" devices --json >/dev/null
STOKE_PLUGIN_PATH="$libdir/stoke/libstoke-backend-simdev.so" \
    "$prefix/bin/stoke" devices --json | grep -q '"backend": "simdev"'
echo "install check: make install PREFIX, pkg-config (shared without LD_LIBRARY_PATH, static)," \
    "CMake package config, installed CLI and simdev plugin work"
