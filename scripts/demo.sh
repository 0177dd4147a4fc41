#!/bin/sh
# make demo: show the accelerator stoke picked, run the loader on its built-in default, then run
# it again on the simulated accelerator (simdev) to show pinned batches copied to a device.
set -eu
build="${1:-build}"
echo "== stoke devices"
"$build/stoke" devices
echo
echo "== stoke load (built-in synthetic dataset, this machine's accelerator)"
"$build/stoke" load
simdev="$build/plugins/libstoke-backend-simdev.so"
if [ -f "$simdev" ]; then
    echo
    echo "== stoke load --shuffle --device simdev --verify (simulated accelerator: STOKE_PLUGIN_PATH=$simdev)"
    STOKE_PLUGIN_PATH="$simdev" "$build/stoke" load --shuffle --device simdev --verify
fi
