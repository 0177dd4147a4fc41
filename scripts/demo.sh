#!/bin/sh
# make demo: show the accelerator stoke picked, then run the loader on its built-in default.
set -eu
build="${1:-build}"
echo "== stoke devices"
"$build/stoke" devices
echo
echo "== stoke load (built-in synthetic dataset)"
"$build/stoke" load
