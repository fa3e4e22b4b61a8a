#!/usr/bin/env bash
# What the GPU interposer adds to each allocation and each kernel launch
# when no compute share is set, and to each memory query (cuMemGetInfo,
# under a quota, with NVML present): the share probe's `bench` (100,000
# calls, 10,000 queries, best of 5 rounds) on the fake driver and fake
# NVML, without and with the interposer, alternating, three times.
# Usage: bench/share_overhead.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build/release}
fake=$build/fake-gpu
[ -x "$fake/probe/share_probe" ] || { echo "build the release preset first ($fake/probe/share_probe)"; exit 1; }
state=/dev/shm/stoker-share-bench-$$
trap 'rm -f $state-*' EXIT
run() {
  rm -f "$state-gpu" "$state-ledger"
  env FAKE_GPU_STATE="$state-gpu" STOKER_GPU_LEDGER="$state-ledger" \
    LD_LIBRARY_PATH="$fake/cuda-current:$fake/nvml:$fake/probe" PROBE_ITERATIONS=100000 "$@" "$fake/probe/share_probe" bench
}
for round in 1 2 3; do
  without=$(run env)
  with=$(run env LD_PRELOAD="$build/lib/libstoker-share.so" STOKER_GPU_MEMORY_LIMIT=8GiB)
  python3 - "$without" "$with" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("allocation (cuMemAlloc + cuMemFree): %.0f ns -> %.0f ns, +%.2f us per call; launch: %.0f ns -> %.0f ns, +%.3f us"
      % (a["alloc_free_ns"], b["alloc_free_ns"], (b["alloc_free_ns"] - a["alloc_free_ns"]) / 2e3,
         a["launch_ns"], b["launch_ns"], (b["launch_ns"] - a["launch_ns"]) / 1e3))
print("  memory query (cuMemGetInfo under a quota): %.0f ns -> %.0f ns" % (a["mem_get_info_ns"], b["mem_get_info_ns"]))
PY
done
