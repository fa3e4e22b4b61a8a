"""Field decoding, one image at a time on one thread: stoker.decode_image
against Pillow (Image.open + convert + numpy), on the photographs scikit-image
ships as PNG (RGB and gray, 8-bit) and the same re-encoded as WebP (lossy
q=90, lossless), PNG with alpha, TIFF (uncompressed and LZW), PGM/PPM (maxval 255 and 1000) and
BMP (24-bit or 8-bit grey, and an 8-bit palette). Each figure is the best of --repeats
rounds of --rounds decodes (steady state, page cache warm).

    .venv/bin/python bench/field_decode.py [--repeats 5] [--rounds 20]
"""
import argparse
import io
import os
import sys
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import make_demo_data  # noqa: E402
import stoker  # noqa: E402


def best(fn, data, repeats, rounds):
    fn(data)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(rounds):
            fn(data)
        times.append((time.perf_counter() - t) / rounds)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    folder = make_demo_data.skimage_data_dir()
    cases = []
    for name in ["astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "camera.png", "moon.png"]:
        raw = open(os.path.join(folder, name), "rb").read()
        image = Image.open(io.BytesIO(raw))
        mode = "L" if image.mode == "L" else "RGB"
        cases.append(("PNG " + image.mode, name, raw, mode))
        for label, compression in [("TIFF raw", None), ("TIFF LZW", "tiff_lzw")]:
            buf = io.BytesIO()
            image.save(buf, "TIFF", compression=compression)
            cases.append((label, name, buf.getvalue(), mode))
        buf = io.BytesIO()
        image.save(buf, "PPM")  # P6 or P5, maxval 255
        cases.append(("PPM/PGM", name, buf.getvalue(), mode))
        buf = io.BytesIO()
        image.save(buf, "BMP")  # 24-bit, or 8-bit with a grey palette
        cases.append(("BMP", name, buf.getvalue(), mode))
        if image.mode == "RGB":
            buf = io.BytesIO()
            image.convert("P").save(buf, "BMP")
            cases.append(("BMP palette", name, buf.getvalue(), "RGB"))
        scaled = (np.asarray(image).astype(np.uint32) * 1000 // 255).astype(">u2")  # maxval 1000: scaled per sample
        header = b"P6" if image.mode == "RGB" else b"P5"
        data = header + b"\n%d %d\n1000\n" % image.size + scaled.tobytes()
        cases.append(("PPM/PGM 16-bit", name, data, mode))
        if image.mode == "RGB":
            for label, kw in [("WebP lossy q90", dict(quality=90)), ("WebP lossless", dict(lossless=True))]:
                buf = io.BytesIO()
                image.save(buf, "WEBP", **kw)
                cases.append((label, name, buf.getvalue(), "RGB"))
            buf = io.BytesIO()
            rgba = image.copy()
            rgba.putalpha(128)
            rgba.save(buf, "PNG")
            cases.append(("PNG RGBA", name, buf.getvalue(), "RGBA"))
    print("%-16s %-20s %9s %10s %10s %7s" % ("format", "image", "pixels", "Pillow ms", "stoker ms", "ratio"))
    totals = {}
    for label, name, data, mode in cases:
        w, h = Image.open(io.BytesIO(data)).size
        pil = best(lambda d: np.asarray(Image.open(io.BytesIO(d)).convert(mode)), data, args.repeats, args.rounds)
        ours = best(lambda d: stoker.decode_image(d, mode), data, args.repeats, args.rounds)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert(mode)).reshape(h, w, -1),
                              stoker.decode_image(data, mode).numpy())
        print("%-16s %-20s %9d %10.2f %10.2f %6.2fx" % (label, name, w * h, pil * 1e3, ours * 1e3, pil / ours))
        t = totals.setdefault(label, [0.0, 0.0])
        t[0] += pil
        t[1] += ours
    print()
    for label, (pil, ours) in totals.items():
        print("%-16s Pillow %.2f ms, stoker %.2f ms per set: stoker at %.0f%% of Pillow's time" %
              (label, pil * 1e3, ours * 1e3, 100 * ours / pil))


if __name__ == "__main__":
    main()
