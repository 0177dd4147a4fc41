#!/bin/sh
# make demo: show the accelerator stoke picked, then run the loader on its built-in default.
set -eu
build="${1:-build}"
echo "== stoke devices"
"$build/stoke" devices
if "$build/stoke" help 2>/dev/null | grep -q '^  load'; then
    echo
    echo "== stoke load (synthetic default)"
    "$build/stoke" load
fi
