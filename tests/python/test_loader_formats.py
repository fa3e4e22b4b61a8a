"""PNG, WebP and TIFF images through the loader's transformed path: the same
crop, resize and flip as torchvision on the Pillow-decoded image, and packed
ImageFolder trees that mix JPEG, PNG, WebP, TIFF and PPM."""
import io

import numpy as np
import pytest
import torchvision.transforms as tv
from PIL import Image

import stoker

T = stoker.transforms


def encoded(image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def sources(demo_images):
    """A few demo photographs as PNG (RGB, RGBA, palette, 16-bit gray) and WebP."""
    out = []
    for path in sorted(demo_images.rglob("*.JPEG"))[:3]:
        rgb = Image.open(path).convert("RGB")
        out.append(("png", encoded(rgb, "PNG")))
        rgba = rgb.copy()
        rgba.putalpha(200)
        out.append(("png rgba", encoded(rgba, "PNG")))
        out.append(("png palette", encoded(rgb.convert("P"), "PNG")))
        gray16 = Image.fromarray(np.asarray(rgb.convert("L")).astype(np.uint16) * 257)  # I;16: Pillow 13 writes it
        out.append(("png gray16", encoded(gray16, "PNG")))
        out.append(("webp", encoded(rgb, "WEBP", quality=90)))
        out.append(("webp lossless", encoded(rgb, "WEBP", lossless=True)))
        out.append(("tiff lzw", encoded(rgb, "TIFF", compression="tiff_lzw")))
        out.append(("tiff gray16", encoded(gray16, "TIFF", compression="tiff_adobe_deflate")))
        out.append(("ppm", encoded(rgb, "PPM")))
        out.append(("pgm", encoded(rgb.convert("L"), "PPM")))
    return out


def test_eval_transform_of_png_and_webp_matches_torchvision(sources):
    for label, data in sources:
        ours, trace = T.apply(data, T.Compose([T.Resize(256), T.CenterCrop(224)]), dtype="uint8")
        assert trace["decode_scale"] == 1
        ref = np.asarray(tv.Compose([tv.Resize(256), tv.CenterCrop(224)])(Image.open(io.BytesIO(data)).convert("RGB")))
        assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= 1, label


def test_random_resized_crop_of_png_and_webp_matches_torchvision_for_the_same_box(sources):
    transform = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip()])
    for i, (label, data) in enumerate(sources):
        ours, trace = T.apply(data, transform, dtype="uint8", seed=5, sample=i)
        x0, y0, x1, y1 = (int(v) for v in trace["box"])
        ref = Image.open(io.BytesIO(data)).convert("RGB").crop((x0, y0, x1, y1)).resize((160, 160), Image.BILINEAR)
        if trace["flipped"]:
            ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
        assert np.abs(ours.numpy().astype(int) - np.asarray(ref).astype(int)).max() <= 1, label


def test_a_packed_tree_mixing_jpeg_png_and_webp_loads_every_image(cli, demo_images, tmp_path):
    tree = tmp_path / "mixed"
    files = {}
    for n, path in enumerate(sorted(demo_images.rglob("*.JPEG"))[:18]):
        cls = path.parent.name
        (tree / cls).mkdir(parents=True, exist_ok=True)
        kind = ("jpg", "png", "webp", "tif", "ppm")[n % 5]
        target = tree / cls / ("%02d.%s" % (n, kind))
        if kind == "jpg":
            target.write_bytes(path.read_bytes())
        else:
            Image.open(path).convert("RGB").save(target, {"png": "PNG", "webp": "WEBP", "tif": "TIFF", "ppm": "PPM"}[kind],
                                                 **({"quality": 85} if kind == "webp" else {}))
        files[(cls, target.stem)] = target
    result = cli("pack", tree, tmp_path / "packed")
    assert "not JPEG" not in result.stdout + result.stderr
    transform = T.Compose([T.Resize(96), T.CenterCrop(96)])
    loader = stoker.Loader(tmp_path / "packed", batch_size=6, shuffle=False, transform=transform, dtype="uint8",
                           layout="NHWC", log_epochs=False)
    classes = sorted({cls for cls, _ in files})
    seen = 0
    by_index = sorted(files.items())
    for images, labels in loader:
        for image, label in zip(images, labels):
            (cls, stem), path = by_index[seen]
            ours, _ = T.apply(path.read_bytes(), transform, dtype="uint8")
            assert classes[int(label)] == cls
            assert np.array_equal(image.numpy(), ours.numpy()), path
            seen += 1
    assert seen == len(files)
