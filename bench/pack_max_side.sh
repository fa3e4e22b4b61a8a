#!/usr/bin/env bash
# Lighter images at pack time: the demo data packed as it is and with
# --max-side 512 --quality 90 (and 400 / 90, 256 / 85), then, for each: the
# size on disk, the one-thread decode+transform ceiling (stoker_decode_bench,
# train and eval transforms) and `stoker bench` images/s (all cores, 2
# epochs). The last row is the ceiling of any --max-side 512: the images it
# leaves byte-identical (longest side <= 512) packed alone, as if the
# re-encoded ones cost nothing; compare its time per epoch, not its rate.
#
#   bench/pack_max_side.sh [IMAGES]   # default: 2,000 demo images made here
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
images=${1:-}
if [ -z "$images" ]; then
  images="$work/images"
  .venv/bin/python scripts/make_demo_data.py "$images" --classes 20 --per-class 100 --jobs "$(nproc)" >/dev/null
fi
stoker=build/release/stoker
run() {  # NAME, pack options... (packs $source, the images unless set)
  local name=$1; shift
  local out="$work/$name"
  "$stoker" pack "${source:-$images}" "$out" "$@" | grep -E "re-encoded|packed" | sed "s/^/  $name: /" >&2
  local size decode_train decode_eval line bench seconds
  size=$(du -sb "$out" | cut -f1)
  decode_train=$(build/release/bench/stoker_decode_bench "$out" --threads-for-ceiling 1 --images 1000 |
    grep -oE 'no I/O: [0-9]+ images/s' | grep -oE '[0-9]+' || true)
  decode_eval=$(build/release/bench/stoker_decode_bench "$out" --threads-for-ceiling 1 --images 1000 --eval |
    grep -oE 'no I/O: [0-9]+ images/s' | grep -oE '[0-9]+' || true)
  line=$("$stoker" bench "$out" --epochs 2 | grep -E "^epoch 1: [0-9]+ batches")
  bench=$(grep -oE '[0-9]+ img/s' <<<"$line" | grep -oE '[0-9]+')
  seconds=$(grep -oE 'images in [0-9.]+ s' <<<"$line" | grep -oE '[0-9.]+')
  printf '%-22s %10.1f MB %14s %14s %12s %8s\n' "$name" "$(echo "$size / 1000000" | bc -l)" "$decode_train" \
    "$decode_eval" "$bench" "$seconds"
}
printf '%-22s %13s %14s %14s %12s %8s\n' "packed" "on disk" "decode train/s" "decode eval/s" "bench img/s" "epoch s"
run "as-is"
run "max-side 512, q90" --max-side 512 --quality 90
run "max-side 400, q90" --max-side 400 --quality 90
run "max-side 256, q85" --max-side 256 --quality 85
small="$work/small-only"
.venv/bin/python - "$images" "$small" <<'PY'
import os, sys
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
kept = 0
for folder, _, files in os.walk(src):
    for name in files:
        path = os.path.join(folder, name)
        with Image.open(path) as image:
            if max(image.size) > 512:
                continue
        out = os.path.join(dst, os.path.relpath(folder, src))
        os.makedirs(out, exist_ok=True)
        os.symlink(os.path.abspath(path), os.path.join(out, name))
        kept += 1
print(f"  small-only: {kept} images with longest side <= 512", file=sys.stderr)
PY
source="$small" run "only <= 512 (ceiling)"
