#!/usr/bin/env python3
"""Makes a variant of an ImageFolder tree of JPEGs, for measuring where the
CPU time goes on images unlike the demo's (README, "Where each image's CPU
time goes"):

    .venv/bin/python bench/image_variants.py small  demo/images-40x125 /tmp/small-40x125
    .venv/bin/python bench/image_variants.py smooth demo/images-40x125 /tmp/smooth-40x125

`small`: each image scaled (Lanczos) so its longer side is 256 px, saved at
quality 85 (as `stoker pack --max-side 256 --quality 85` stores it: the
low-resolution copies many pipelines train from). `smooth`: each image at
its own size, blurred (Gaussian, radius 0.6) and saved at quality 90, so
it has half the bytes per pixel (less detail: a smoother photograph; the
demo's 86 KB at 187 kpx become 41 KB). Both
keep 4:2:0 chroma sampling and baseline coding, as most photographs have.
Prints the images' mean size in KB and kilopixels.
"""
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from PIL import Image, ImageFilter


def convert(job):
    kind, src, dst = job
    with Image.open(src) as image:
        image = image.convert("RGB")
        if kind == "small":
            scale = 256 / max(image.size)
            if scale < 1:
                image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                     Image.LANCZOS)
            quality = 85
        else:
            image = image.filter(ImageFilter.GaussianBlur(0.6))
            quality = 90
        image.save(dst, "JPEG", quality=quality, subsampling=2)
        return os.path.getsize(dst), image.width * image.height


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("small", "smooth"):
        print("usage: image_variants.py small|smooth SRC_TREE DST_TREE", file=sys.stderr)
        return 2
    kind, src_root, dst_root = sys.argv[1:]
    jobs = []
    for folder in sorted(os.listdir(src_root)):
        if not os.path.isdir(os.path.join(src_root, folder)):
            continue
        os.makedirs(os.path.join(dst_root, folder), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(src_root, folder))):
            jobs.append((kind, os.path.join(src_root, folder, name), os.path.join(dst_root, folder, name)))
    if not jobs:
        print("no class folders with images in %s" % src_root, file=sys.stderr)
        return 1
    with ProcessPoolExecutor() as pool:
        done = list(pool.map(convert, jobs, chunksize=64))
    total_bytes = sum(b for b, _ in done)
    total_pixels = sum(p for _, p in done)
    print("%d images, %.1f KB and %.0f kpx on average" % (len(done), total_bytes / len(done) / 1e3,
                                                          total_pixels / len(done) / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
