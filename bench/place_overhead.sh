#!/usr/bin/env bash
# What `stoker gpu run` adds before the command starts: wall time of
# `stoker gpu run ... -- /bin/true` against `/bin/true` itself, 200 runs
# each, alternating, on the fake NVML (8 cards, 50 live leases in the lease
# file), placing (the default) and with --no-place; and the parts: `stoker
# --version` (the CLI starting) and /bin/true with the interposer preloaded.
# Usage: bench/place_overhead.sh [BUILD_DIR]
set -euo pipefail
build=$(cd "${1:-build/release}" && pwd)
fake=$build/fake-gpu
[ -f "$fake/nvml/libnvidia-ml.so.1" ] || { echo "build the release preset first ($fake/nvml)"; exit 1; }
work=$(mktemp -d /dev/shm/stoker-place-overhead-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export FAKE_GPU_STATE=$work/gpu FAKE_GPU_DEVICES=8 FAKE_GPU_MEMORY=151397597184 \
  LD_LIBRARY_PATH="$fake/cuda-current:$fake/nvml" STOKER_GPU_LEASES=$work/leases.json STOKER_GPU_LEDGER=$work/ledger
for i in $(seq 50); do "$build/stoker" gpu run --memory 1GiB --quiet --ledger "$work/ledger" -- sleep 600 & done
sleep 2
python3 - "$build/stoker" "$work/ledger" "$build/lib/libstoker-share.so" <<'PY'
import os, subprocess, sys, time
stoker, ledger, interposer = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {"true": ["/bin/true"],
        "gpu run (placing)": [stoker, "gpu", "run", "--memory", "1GiB", "--quiet", "--ledger", ledger, "--", "/bin/true"],
        "gpu run --no-place": [stoker, "gpu", "run", "--memory", "1GiB", "--no-place", "--quiet", "--ledger", ledger, "--",
                               "/bin/true"],
        "stoker --version": [stoker, "--version"],
        "true, preloaded": ["/bin/true"]}
preloaded = dict(os.environ, LD_PRELOAD=interposer)
times = {k: [] for k in runs}
for _ in range(200):
    for name, argv in runs.items():
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=preloaded if name == "true, preloaded" else None)
        times[name].append(time.perf_counter() - t)
med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
for k, v in med.items():
    print("%-20s median %.2f ms, +%.2f ms over /bin/true" % (k, v, v - med["true"]))
PY
