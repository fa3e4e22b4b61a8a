"""Boxes, keypoints and masks that follow the transformed image: each
sample's mask must equal torchvision's functional ops replayed with the
image's trace (nearest sampling), each box must enclose its object's moved
pixels (the mask's label region), boxes that leave the image are dropped
with their labels, and bad targets are named with their sample."""
import io
import json
import tarfile

import numpy as np
import pytest
import torch  # noqa: E402  (scripts/deps installs Debian's python3-torch)
import torchvision.transforms.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402

import stoker  # noqa: E402  (PYTHONPATH=<build>/python, set by ctest)
T = stoker.transforms
W, H = 160, 120


def member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def encoded(image, fmt):
    buf = io.BytesIO()
    image.save(buf, fmt, quality=95) if fmt == "JPEG" else image.save(buf, fmt)
    return buf.getvalue()


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def objects(i):
    """Three rectangles (x0, y0, x1, y1), the last one touching the right edge."""
    return [(10 + i % 5, 12, 50, 40 + i % 7), (70, 50 + i % 4, 110, 100), (130 + i % 3, 5, W, 30)]


def rasters(mask):
    """Rasters beside the label map, each a function of its labels and of
    the pixel's place: a 16-bit id map, a colour-coded (panoptic-style) map,
    float depth, planar uint16 bands and each pixel's own index."""
    labels = mask.astype(np.int64)
    index = np.arange(H * W, dtype=np.int32).reshape(H, W)
    return {"inst.png": encoded(Image.fromarray((labels * 1000 + 7).astype(np.uint16)), "PNG"),
            "pan.png": encoded(Image.fromarray(np.stack([labels * 40, labels * 7, 255 - labels], 2).astype(np.uint8)),
                               "PNG"),
            "depth.npy": npy((labels + 0.5).astype(np.float32)),
            "bands.tif": tiff(np.stack([labels * 3, index % 4099]).astype(np.uint16)),
            "where.npy": npy(index)}


def tiff(array):
    import tifffile
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, planarconfig="separate", photometric="minisblack")
    return buf.getvalue()


def write_dataset(folder, n=24, per_shard=8, bad=None):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for s in range(0, n, per_shard):
        with tarfile.open(folder / ("shard-%06d.tar" % (s // per_shard)), "w") as tar:
            for i in range(s, min(n, s + per_shard)):
                y, x = np.mgrid[0:H, 0:W]
                rgb = np.stack([x, y * 2, (x + y) % 256], axis=2).astype(np.uint8)
                mask = np.zeros((H, W), np.uint8)
                boxes = objects(i)
                for k, (x0, y0, x1, y1) in enumerate(boxes):
                    mask[y0:y1, x0:x1] = k + 1
                    rgb[y0:y1, x0:x1] = (60 * (k + 1), 255 - 60 * k, 90)
                rgb = np.clip(rgb.astype(int) + rng.integers(-3, 4, rgb.shape), 0, 255).astype(np.uint8)
                sample = {"jpg": encoded(Image.fromarray(rgb), "JPEG"), "seg.png": encoded(Image.fromarray(mask), "PNG"),
                          "boxes.npy": npy(np.array(boxes, np.float32)),
                          "labels.npy": npy(np.arange(1, 4, dtype=np.int64)),
                          "keypoints.json": json.dumps([[(a + c) / 2, (b + d) / 2] for a, b, c, d in boxes]).encode(),
                          **rasters(mask)}
                if bad and i == bad[0]:
                    sample[bad[1]] = bad[2]
                for ext, data in sample.items():
                    member(tar, "%06d.%s" % (i, ext), data)


@pytest.fixture(scope="module")
def dataset(cli, tmp_path_factory):
    folder = tmp_path_factory.mktemp("targets") / "shards"
    write_dataset(folder)
    cli("index", *sorted(folder.glob("*.tar")))
    return folder


RECIPES = {
    "rotation": lambda: T.Compose([T.RandomRotation(20), T.RandomResizedCrop(96, scale=(0.3, 1.0)),
                                   T.RandomHorizontalFlip(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]),
    "affine_after_crop": lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(),
                                            T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1)),
                                            T.ColorJitter(0.3)]),
    "eval": lambda: T.Compose([T.Resize(100), T.CenterCrop(90)]),
    "expand_and_vflip": lambda: T.Compose([T.RandomRotation(30, expand=True), T.RandomVerticalFlip(),
                                           T.RandomResizedCrop(96)]),
}


def reference_mask(mask, trace, transform):
    """torchvision's functional ops on the PIL mask, replaying the image's trace."""
    steps = list(trace["steps"])
    out = mask
    c = transform._options()
    for step in steps:
        if step["name"] == "RandomRotation":
            expand = any(t._name == "RandomRotation" and t.expand for t in transform.transforms
                         if isinstance(t, T.RandomRotation))
            out = F.rotate(out, step["angle"], InterpolationMode.NEAREST, expand=expand, fill=0)
        elif step["name"] == "RandomVerticalFlip" and step["flip"]:
            out = F.vflip(out)
        if step["name"] in ("RandomRotation", "RandomVerticalFlip"):
            continue
        break  # steps after the crop come below
    after = [s for s in steps if s["name"] not in ("RandomRotation", "RandomVerticalFlip")]
    if c.kind == stoker._native.TransformKind.random_resized_crop:
        x0, y0, x1, y1 = (int(v) for v in trace["box"])
        cropped = torch.from_numpy(np.array(out))[y0:y1, x0:x1]
        out = F.resize(cropped[None], [c.height, c.width], InterpolationMode.NEAREST)[0]
    else:
        out = F.resize(torch.from_numpy(np.array(out))[None], c.resize, InterpolationMode.NEAREST)
        out = F.center_crop(out, [c.height, c.width])[0]
    if trace["flipped"]:
        out = out.flip(-1)
    for step in after:
        if step["name"] == "RandomAffine":
            out = F.affine(Image.fromarray(out.numpy()), step["angle"], [int(step["translate_x"]),
                           int(step["translate_y"])], step["scale"], [step["shear_x"], step["shear_y"]],
                           InterpolationMode.NEAREST, fill=0)
            out = torch.from_numpy(np.array(out))
    return out


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_targets_follow_the_image(dataset, recipe):
    transform = RECIPES[recipe]()
    fields = {"image": stoker.Image(transform=transform), "jpg": stoker.Bytes("jpg"),
              "boxes": stoker.Boxes(labels="labels"), "labels": stoker.Array("labels.npy"),
              "mask": stoker.Mask(), "seg": stoker.Bytes("seg.png"), "points": stoker.Keypoints()}
    loader = stoker.Loader(dataset, batch_size=8, fields=fields, seed=3, with_indices=True, log_epochs=False)
    dropped = checked = 0
    for batch in loader:
        assert batch["mask"].dtype == torch.uint8 and batch["mask"].shape[1:] == batch["image"].shape[2:]
        for j in range(len(batch["jpg"])):
            index = int(batch["__index__"][j])
            _, trace = T.apply(batch["jpg"][j], transform, seed=3, epoch=0, sample=index)
            ref = reference_mask(Image.open(io.BytesIO(batch["seg"][j])), trace, transform)
            mask = batch["mask"][j]
            assert torch.equal(mask, ref), (recipe, index)
            boxes, labels = batch["boxes"][j], batch["labels"][j]
            assert boxes.dtype == torch.float32 and boxes.shape[1] == 4 and labels.shape[0] == boxes.shape[0]
            h, w = mask.shape
            assert bool((boxes[:, 0] >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all())
            assert bool((boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all())
            dropped += 3 - boxes.shape[0]
            for box, label in zip(boxes, labels):
                ys, xs = np.nonzero(mask.numpy() == int(label))
                if len(xs) == 0:
                    continue  # its pixels fell between the samples of the resize
                # Every moved pixel of the object lies inside its moved box (a pixel
                # centre at x + 0.5; nearest sampling may shift it by one).
                assert xs.min() + 0.5 >= box[0] - 1.5 and xs.max() + 0.5 <= box[2] + 1.5, (recipe, index, box)
                assert ys.min() + 0.5 >= box[1] - 1.5 and ys.max() + 0.5 <= box[3] + 1.5, (recipe, index, box)
                checked += 1
            points = batch["points"][j]
            assert points.shape == (3, 2)
            for k in range(3):  # an object's moved centre, where still in the image, lies in its moved box
                x, y = float(points[k, 0]), float(points[k, 1])
                if int(k + 1) in labels.tolist() and 0 <= x <= w and 0 <= y <= h:
                    box = boxes[labels.tolist().index(k + 1)]
                    assert box[0] - 1 <= x <= box[2] + 1 and box[1] - 1 <= y <= box[3] + 1, (recipe, index, k)
                    checked += 1
    assert checked > 30
    if recipe == "rotation":
        assert dropped > 0  # crops cut objects off; their labels went with them


def test_box_formats_and_padding(dataset, tmp_path):
    transform = T.Compose([T.Resize(120), T.CenterCrop(120)])  # keeps 160x120 -> 160x120, crops 20 px each side
    fields = {"image": stoker.Image(transform=transform), "xyxy": stoker.Boxes(),
              "padded": stoker.Boxes(pad=-1), "raw": stoker.Boxes(follows=None)}
    batch = next(iter(stoker.Loader(dataset, batch_size=4, shuffle=False, fields=fields, log_epochs=False)))
    for j in range(4):
        expect = np.array(objects(j), np.float32) - [20, 0, 20, 0]
        expect = np.clip(expect, 0, [120, 120, 120, 120])
        assert np.allclose(batch["xyxy"][j].numpy(), expect)
        assert np.allclose(batch["raw"][j].numpy(), np.array(objects(j), np.float32))
    assert batch["padded"].shape == (4, 3, 4) and batch["padded_count"].tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("ext, data, message", [
    ("boxes.npy", npy(np.array([[10, 10, 5, 20]], np.float32)), "negative size"),
    ("boxes.npy", npy(np.array([[10, np.nan, 20, 20]], np.float32)), "NaN"),
    ("boxes.npy", npy(np.zeros((2, 3), np.float32)), "N x 4"),
    ("seg.png", encoded(Image.new("L", (20, 20)), "PNG"), "mask is 20x20"),
    ("labels.npy", npy(np.arange(2)), "labels hold 2 entries for 3 boxes"),
    ("keypoints.json", b"[[1, 2], [3]]", "ragged"),
])
def test_bad_targets_are_named_and_skippable(cli, tmp_path, ext, data, message):
    folder = tmp_path / "bad"
    write_dataset(folder, n=8, bad=(5, ext, data))
    cli("index", *sorted(folder.glob("*.tar")))
    fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(64)])),
              "boxes": stoker.Boxes(labels="labels"), "labels": stoker.Array("labels.npy"), "mask": stoker.Mask(),
              "points": stoker.Keypoints()}
    with pytest.raises(stoker.CorruptionError, match=message) as error:
        for _ in stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields, log_epochs=False):
            pass
    assert "000005" in str(error.value) and "shard-000000.tar" in str(error.value)
    skipping = stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields, on_corrupt="skip", log_epochs=False)
    assert sum(len(b["boxes"]) for b in skipping) == 8
    assert skipping.stats()["corrupt_skipped"] == 1


def test_followers_need_a_transformed_image(dataset):
    with pytest.raises(ValueError, match="no image field is transformed"):
        stoker.Loader(dataset, fields={"image": stoker.Image(), "boxes": stoker.Boxes()})
    with pytest.raises(ValueError, match="Array field"):
        stoker.Loader(dataset, fields={"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(32)])),
                                       "boxes": stoker.Boxes(labels="nope")})
    with pytest.raises(ValueError, match="format"):
        stoker.Boxes(format="yxyx")


RASTERS = {"mask": stoker.Mask(fill=250), "seg": stoker.Bytes("seg.png"),
           "inst": stoker.Mask("inst.png", mode="I;16", fill=65535),
           "pan": stoker.Mask("pan.png", mode="RGB", fill=9),
           "depth": stoker.Array("depth.npy", follows="image", fill=float("nan")),
           "bands": stoker.Array("bands.tif", follows="image", layout="CHW", fill=7),
           "where": stoker.Array("where.npy", follows="image", fill=-1)}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_rasters_of_any_type_take_the_masks_pixels(dataset, recipe):
    """Every raster that follows takes, at each pixel, the value of the
    source pixel the 8-bit mask took there (`where` says which), or its
    fill where the image moved in pixels from outside."""
    fields = dict(RASTERS, image=stoker.Image(transform=RECIPES[recipe]()))
    filled = 0
    for batch in stoker.Loader(dataset, batch_size=8, fields=fields, seed=3, log_epochs=False):
        b, h, w = batch["mask"].shape
        assert batch["image"].shape[2:] == (h, w)
        assert batch["inst"].shape == (b, h, w) and batch["inst"].dtype == torch.int32
        assert batch["pan"].shape == (b, h, w, 3) and batch["pan"].dtype == torch.uint8
        assert batch["depth"].shape == (b, h, w) and batch["depth"].dtype == torch.float32
        assert batch["bands"].shape == (b, 2, h, w) and batch["bands"].dtype == torch.int32
        where = batch["where"].numpy()
        outside = where < 0
        filled += int(outside.sum())
        for j in range(b):
            source = np.array(Image.open(io.BytesIO(batch["seg"][j]))).astype(np.int64).ravel()
            inside = ~outside[j]
            labels = source[where[j][inside]]
            mask = batch["mask"][j].numpy()
            assert (mask[inside] == labels).all() and (mask[outside[j]] == 250).all()
            inst, pan, depth = batch["inst"][j].numpy(), batch["pan"][j].numpy(), batch["depth"][j].numpy()
            assert (inst[inside] == labels * 1000 + 7).all() and (inst[outside[j]] == 65535).all()
            assert (pan[inside] == np.stack([labels * 40, labels * 7, 255 - labels], 1)).all()
            assert (pan[outside[j]] == 9).all()
            assert (depth[inside] == labels + 0.5).all() and np.isnan(depth[outside[j]]).all()
            bands = batch["bands"][j].numpy()
            assert (bands[0][inside] == labels * 3).all() and (bands[1][inside] == where[j][inside] % 4099).all()
            assert (bands[:, outside[j]] == 7).all()
    if recipe in ("rotation", "expand_and_vflip", "affine_after_crop"):
        assert filled > 0  # the recipe moved pixels in from outside


def test_bad_rasters_are_named(dataset, cli, tmp_path):
    transform = T.Compose([T.RandomResizedCrop(64)])
    with pytest.raises(ValueError, match="not a transform of its own"):
        stoker.Array("depth.npy", follows="image", transform=[T.RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="fill"):
        stoker.Mask("inst.png", mode="I;16", fill=65536)
    with pytest.raises(ValueError, match="mode"):
        stoker.Mask(mode="RGBA")
    with pytest.raises(TypeError, match="fill"):
        stoker.Array("depth.npy", follows="image", fill="0")
    assert stoker.Array("depth.npy", follows="image", fill=np.float32("nan"))._spec("d").fill != 0  # NaN
    assert stoker.Array("ids.npy", follows="image", fill=np.uint16(7))._spec("i").fill == 7
    # A fill the array's dtype cannot hold: an error naming the field and sample, even under "skip".
    fields = {"image": stoker.Image(transform=transform), "where": stoker.Array("where.npy", follows="image", fill=0.5)}
    for policy in ("error", "skip"):
        with pytest.raises(ValueError, match=r"field 'where'.*fill 0.5 is no int32 value|fill 0.5 is no int32 value"):
            next(iter(stoker.Loader(dataset, batch_size=4, fields=fields, on_corrupt=policy, log_epochs=False)))
    # An array of another size than its image: Corruption naming the sample, skippable.
    folder = tmp_path / "bad-raster"
    write_dataset(folder, n=8, bad=(5, "depth.npy", npy(np.zeros((H, W + 1), np.float32))))
    cli("index", *sorted(folder.glob("*.tar")))
    fields = {"image": stoker.Image(transform=transform), "depth": stoker.Array("depth.npy", follows="image")}
    with pytest.raises(stoker.CorruptionError, match="the array is 161x120, its image 160x120") as error:
        for _ in stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields, log_epochs=False):
            pass
    assert "000005" in str(error.value) and "shard-000000.tar" in str(error.value)
    skipping = stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields, on_corrupt="skip", log_epochs=False)
    assert sum(len(b["depth"]) for b in skipping) == 8 and skipping.stats()["corrupt_skipped"] == 1


def test_stacked_masks_reach_map_as_rows(dataset):
    """Masks of one shape are stacked natively; map= still sees each
    sample's own [H, W] mask, equal to the stacked batch's row."""
    transform = T.Compose([T.RandomResizedCrop(48)])
    fields = {"image": stoker.Image(transform=transform), "mask": stoker.Mask(),
              "inst": stoker.Mask("inst.png", mode="I;16")}
    plain = next(iter(stoker.Loader(dataset, batch_size=4, seed=1, shuffle=False, fields=fields, log_epochs=False)))
    seen = []
    mapped = next(iter(stoker.Loader(dataset, batch_size=4, seed=1, shuffle=False, fields=fields, log_epochs=False,
                                     map=lambda s: seen.append(tuple(s["mask"].shape)) or s)))
    assert seen == [(48, 48)] * 4
    assert torch.equal(mapped["mask"], plain["mask"]) and torch.equal(mapped["inst"], plain["inst"])
    assert plain["inst"].dtype == torch.int32 and plain["mask"].shape == (4, 48, 48)
