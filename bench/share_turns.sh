#!/usr/bin/env bash
# The compute turns on the fake driver, two measurements:
#  collectives  two NCCL-like jobs (a rank per card on the same two cards,
#               50% each) run COUNT collectives of 1 ms per rank: seconds
#               taken and the longest wait per rank;
#  long         a 30% tenant with KERNEL_US kernels beside a 70% tenant with
#               1 ms kernels for SECONDS: the device time each got.
# Usage: bench/share_turns.sh [BUILD_DIR] [collectives|long] (both by default)
#   COUNT=2000 KERNEL_US=1500000 SECONDS_RUN=20 INTERPOSER=path/libstoker-share.so
# To compare with an earlier interposer, build it in a worktree
# (git worktree add /tmp/old REV; cmake --preset release; cmake --build
# build/release --target stoker_interposer share_probe fake_cuda_current)
# and pass BUILD_DIR=/tmp/old/build/release (its own probe and fake driver).
set -euo pipefail
build=${1:-build/release}
what=${2:-both}
fake=$build/fake-gpu
lib=${INTERPOSER:-$build/lib/libstoker-share.so}
[ -x "$fake/probe/share_probe" ] || { echo "build the release preset first ($fake/probe/share_probe)"; exit 1; }
tag=$$
trap 'rm -f /dev/shm/stoker-turns-bench-$tag-* /tmp/stoker-turns-bench-$tag-*' EXIT
common() {
  echo FAKE_GPU_STATE=/dev/shm/stoker-turns-bench-$tag-gpu STOKER_GPU_LEDGER=/dev/shm/stoker-turns-bench-$tag-ledger \
    LD_PRELOAD=$lib LD_LIBRARY_PATH=$fake/cuda-current:$fake/probe
}
if [ "$what" != long ]; then
  pids=()
  for job in 0 1; do for rank in 0 1; do
    env $(common) FAKE_GPU_DEVICES=2 CUDA_VISIBLE_DEVICES=$rank STOKER_GPU_TENANT=job$job STOKER_GPU_COMPUTE_SHARE=50 \
      PROBE_GROUP=$job PROBE_PEERS=2 PROBE_KERNEL_US=1000 PROBE_COUNT=${COUNT:-2000} \
      "$fake/probe/share_probe" collective > /tmp/stoker-turns-bench-$tag-$job$rank 2>&1 &
    pids+=($!)
  done; done
  wait "${pids[@]}"
  for job in 0 1; do for rank in 0 1; do
    echo "collectives: job $job rank $rank: $(tail -1 /tmp/stoker-turns-bench-$tag-$job$rank)"
  done; done
  if [ -x "$build/stoker" ]; then
    STOKER_GPU_LEASES=/dev/shm/stoker-turns-bench-$tag-leases.json \
      "$build/stoker" gpu ls --ledger /dev/shm/stoker-turns-bench-$tag-ledger --json 2>/dev/null | python3 -c \
      'import json, sys; d = json.load(sys.stdin)["devices"]; print("turns taken by the stuck timer:", sum(x.get("stuck_takeovers", 0) for x in d))' || true
  fi
  rm -f /dev/shm/stoker-turns-bench-$tag-*
fi
if [ "$what" != collectives ]; then
  seconds=${SECONDS_RUN:-20}
  env $(common) STOKER_GPU_TENANT=a STOKER_GPU_COMPUTE_SHARE=30 PROBE_SECONDS=$((seconds * 1000)) PROBE_SYNC_EVERY=1 \
    PROBE_KERNEL_US=${KERNEL_US:-1500000} "$fake/probe/share_probe" compute > /tmp/stoker-turns-bench-$tag-a 2>&1 &
  env $(common) STOKER_GPU_TENANT=b STOKER_GPU_COMPUTE_SHARE=70 PROBE_SECONDS=$((seconds * 1000)) PROBE_KERNEL_US=1000 \
    "$fake/probe/share_probe" compute > /tmp/stoker-turns-bench-$tag-b 2>&1 &
  wait
  python3 - "$(tail -1 /tmp/stoker-turns-bench-$tag-a)" "$(tail -1 /tmp/stoker-turns-bench-$tag-b)" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
da, db = a["device_seconds"], b["device_seconds"]
print("long kernels: 30%% tenant %.1f s of device time, 70%% tenant %.1f s: split %.0f/%.0f" % (da, db, 100 * da / (da + db), 100 * db / (da + db)))
PY
fi
