#!/usr/bin/env python3
"""Makes an ImageNet-like folder of JPEG files cut from real photographs.

The photographs are the sample images that Debian's python3-skimage ships
(astronaut, coffee, chelsea, rocket, retina, motorcycles, ...). Each class
draws from one photograph with its own colour cast; each image is a random
crop, resized so that its shorter side is 300-500 px (as in ImageNet), with a
little sensor-like noise so JPEG sizes are realistic (~100 KB at quality 95).

Output (ImageFolder layout): OUT/nXXXXXXXX/nXXXXXXXX_NNNNN.JPEG, as ImageNet
names them. Deterministic for a given --seed.

    make_demo_data.py OUT [--classes 40] [--per-class 125] [--seed 0] [--jobs N]
"""
import argparse
import importlib.util
import multiprocessing
import os
import random
import sys

from PIL import Image, ImageEnhance, ImageOps

PHOTOS = [  # colour photographs first, then grey ones (tinted per class)
    "astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
    "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg",
    "camera.png", "brick.png", "grass.png", "gravel.png", "moon.png", "cell.png", "coins.png",
    "clock_motion.png",
]


def skimage_data_dir():
    spec = importlib.util.find_spec("skimage")
    candidates = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    candidates.append("/usr/lib/python3/dist-packages/skimage")
    for base in candidates:
        path = os.path.join(base, "data")
        if os.path.exists(os.path.join(path, PHOTOS[0])):
            return path
    sys.exit("make_demo_data: cannot find skimage's sample photographs; install Debian's python3-skimage")


_SOURCES = {}


def load(data_dir, name):
    if name not in _SOURCES:
        image = Image.open(os.path.join(data_dir, name))
        image.load()
        _SOURCES[name] = image.convert("RGB")
    return _SOURCES[name]


def class_name(c):
    return "n%08d" % (1440764 + c * 7919)  # ImageNet-like synset ids


def make_image(job):
    data_dir, out_dir, c, i, seed, quality = job
    rng = random.Random(seed * 1_000_003 + c * 10_007 + i)
    photo = load(data_dir, PHOTOS[c % len(PHOTOS)])
    w, h = photo.size
    # A random crop covering 35-100% of the photograph, aspect 3:4 .. 4:3.
    area = rng.uniform(0.35, 1.0) * w * h
    aspect = rng.uniform(3 / 4, 4 / 3)
    cw = max(64, min(w, int(round((area * aspect) ** 0.5))))
    ch = max(64, min(h, int(round((area / aspect) ** 0.5))))
    x = rng.randint(0, w - cw)
    y = rng.randint(0, h - ch)
    image = photo.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        image = ImageOps.mirror(image)
    short = rng.randint(300, 500)
    scale = short / min(cw, ch)
    image = image.resize((max(short, round(cw * scale)), max(short, round(ch * scale))), Image.BILINEAR)
    # Per-class colour cast and per-image brightness, then mild noise.
    cast_rng = random.Random(seed + c)
    cast = Image.new("RGB", image.size, tuple(cast_rng.randint(0, 255) for _ in range(3)))
    image = Image.blend(image, cast, 0.15 if c >= 9 else 0.06)
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.8, 1.2))
    noise = Image.merge("RGB", [Image.effect_noise(image.size, 18) for _ in range(3)])
    image = Image.blend(image, noise, 0.35)
    path = os.path.join(out_dir, class_name(c), "%s_%05d.JPEG" % (class_name(c), i))
    image.save(path, "JPEG", quality=quality)
    return os.path.getsize(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--classes", type=int, default=40)
    parser.add_argument("--per-class", type=int, default=125)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quality", type=int, default=95)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--photos", help="a folder holding the source photographs (default: skimage's data folder); "
                                         "scripts/gpu-deps copies them for machines without Debian's python3-skimage")
    args = parser.parse_args()
    if args.classes < 1 or args.per_class < 1:
        parser.error("--classes and --per-class must be positive")
    data_dir = args.photos or skimage_data_dir()
    missing = [p for p in PHOTOS if not os.path.exists(os.path.join(data_dir, p))]
    if missing:
        sys.exit("make_demo_data: %s lacks %s" % (data_dir, ", ".join(missing)))
    for c in range(args.classes):
        os.makedirs(os.path.join(args.out, class_name(c)), exist_ok=True)
    jobs = [(data_dir, args.out, c, i, args.seed, args.quality)
            for c in range(args.classes) for i in range(args.per_class)]
    total = 0
    with multiprocessing.Pool(args.jobs) as pool:
        for n, size in enumerate(pool.imap(make_image, jobs, chunksize=16), 1):
            total += size
            if sys.stderr.isatty() and (n % 100 == 0 or n == len(jobs)):
                print("\rmake_demo_data: %d/%d images" % (n, len(jobs)), end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print("made %d JPEG images in %d classes under %s (%.1f MB, %.0f KB average)"
          % (len(jobs), args.classes, args.out, total / 1e6, total / len(jobs) / 1e3))


if __name__ == "__main__":
    main()
