"""Augmentation steps against torchvision's functional ops on PIL images: each
stoker step, given (or drawing and reporting) its parameters, must give
torchvision's pixels for the same parameters; replays repeat; bad arguments
are refused at construction; the loader runs the steps deterministically."""
import io
import math

import numpy as np
import pytest
import torch  # noqa: E402  (scripts/deps installs Debian's python3-torch)
import torchvision.transforms.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.autoaugment import _apply_op  # noqa: E402

import stoker  # noqa: E402  (PYTHONPATH=<build>/python, set by ctest)
T = stoker.transforms


@pytest.fixture(scope="module")
def photos(demo_images):
    paths = sorted(demo_images.rglob("*.JPEG"))[:5]
    return [Image.open(p).convert("RGB") for p in paths]


def agreement(ours, ref):
    """Shares of values equal and within 1 level, and the largest difference."""
    a = np.asarray(ours).astype(int)
    b = np.asarray(ref).astype(int)
    assert a.shape == b.shape, (a.shape, b.shape)
    d = np.abs(a - b)
    return float(np.mean(d == 0)), float(np.mean(d <= 1)), int(d.max())


def assert_exact(ours, ref, what):
    exact, _, worst = agreement(ours, ref)
    assert exact == 1.0, "%s: %.5f of values equal, largest difference %d" % (what, exact, worst)


def assert_within_one_level(ours, ref, what):
    _, within, worst = agreement(ours, ref)
    assert within >= 0.999, "%s: %.5f within 1 level, largest difference %d" % (what, within, worst)


def mode(name):
    return InterpolationMode(name)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("expand", [False, True])
def test_random_rotation_matches_torchvision(photos, interpolation, expand):
    step = T.RandomRotation(40, interpolation=interpolation, expand=expand, fill=(10, 200, 30))
    for i, img in enumerate(photos):
        ours, trace = T.apply(img, step, sample=i)
        angle = trace["steps"][0]["angle"]
        assert -40 <= angle <= 40
        ref = F.rotate(img, angle, interpolation=mode(interpolation), expand=expand, fill=[10, 200, 30])
        assert_exact(ours, ref, "rotate %.3f" % angle)


def test_rotation_fast_paths_and_a_centre(photos):
    img = photos[0]
    for angle in (0.0, 90.0, 180.0, 270.0, -90.0, 360.0):
        ours, _ = T.apply(img, T.RandomRotation(5), params=[{"name": "RandomRotation", "angle": angle}])
        assert_exact(ours, F.rotate(img, angle), "rotate %g" % angle)
    ours, _ = T.apply(img, T.RandomRotation(5, expand=True), params=[{"name": "RandomRotation", "angle": 90.0}])
    assert_exact(ours, F.rotate(img, 90.0, expand=True), "rotate 90 expand")
    ours, _ = T.apply(img, T.RandomRotation(5, center=(10, 20)), params=[{"name": "RandomRotation", "angle": 33.0}])
    assert_exact(ours, F.rotate(img, 33.0, center=[10, 20]), "rotate about (10, 20)")


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_random_affine_matches_torchvision(photos, interpolation):
    step = T.RandomAffine(25, translate=(0.1, 0.2), scale=(0.7, 1.3), shear=(-10, 10, -5, 5),
                          interpolation=interpolation, fill=77)
    for i, img in enumerate(photos):
        ours, trace = T.apply(img, step, sample=i)
        p = trace["steps"][0]
        assert p["translate_x"] == int(p["translate_x"]) and abs(p["translate_x"]) <= 0.1 * img.width + 0.5
        ref = F.affine(img, p["angle"], [int(p["translate_x"]), int(p["translate_y"])], p["scale"],
                       [p["shear_x"], p["shear_y"]], interpolation=mode(interpolation), fill=[77, 77, 77])
        assert_exact(ours, ref, "affine %r" % p)


def test_colour_steps_match_torchvision(photos):
    jitter = T.ColorJitter(0.5, 0.5, 0.5, 0.2)
    hues = []
    for i, img in enumerate(photos * 4):
        ours, trace = T.apply(img, jitter, sample=i)
        p = trace["steps"][0]
        assert sorted(int(p["order%d" % k]) for k in range(4)) == [0, 1, 2, 3]
        ref = img
        for k in (int(p["order%d" % k]) for k in range(4)):
            ref = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue][k](
                ref, p[["brightness", "contrast", "saturation", "hue"][k]])
        hues.append(p["hue"])
        assert_exact(ours, ref, "jitter %r" % p)
    assert min(hues) < 0 < max(hues)  # negative hue shifts wrap as numpy's uint8 does
    only_brightness, trace = T.apply(photos[0], T.ColorJitter(brightness=0.3))
    assert trace["steps"][0]["hue"] is None and trace["steps"][0]["contrast"] is None
    assert_exact(only_brightness, F.adjust_brightness(photos[0], trace["steps"][0]["brightness"]), "brightness")
    assert_exact(T.apply(photos[1], T.Grayscale(3))[0], F.rgb_to_grayscale(photos[1], 3), "grayscale")
    ours, trace = T.apply(photos[2], T.RandomGrayscale(1.0))
    assert trace["steps"][0]["gray"] == 1
    assert_exact(ours, F.rgb_to_grayscale(photos[2], 3), "random grayscale")


def test_blur_within_one_level(photos):
    for i, img in enumerate(photos):
        ours, trace = T.apply(img, T.GaussianBlur((9, 5), sigma=(0.1, 3.0)), sample=i)
        sigma = trace["steps"][0]["sigma"]
        assert_within_one_level(ours, F.gaussian_blur(img, [9, 5], [sigma, sigma]), "blur %g" % sigma)


def test_geometry_steps_match_torchvision(photos):
    img = photos[3]
    for padding_mode in ("constant", "edge", "reflect", "symmetric"):
        ours, _ = T.apply(img, T.Pad((3, 5, 7, 9), fill=(1, 2, 3), padding_mode=padding_mode))
        assert_exact(ours, F.pad(img, [3, 5, 7, 9], fill=(1, 2, 3), padding_mode=padding_mode), padding_mode)
    ours, trace = T.apply(img, T.RandomCrop(100, padding=4, padding_mode="reflect"), sample=1)
    p = trace["steps"][0]
    assert_exact(ours, F.crop(F.pad(img, 4, padding_mode="reflect"), int(p["top"]), int(p["left"]), 100, 100), "crop")
    small = img.resize((40, 30))
    ours, trace = T.apply(small, T.RandomCrop(64, pad_if_needed=True), sample=2)
    p = trace["steps"][0]
    padded = F.pad(F.pad(small, [24, 0]), [0, 34])
    assert_exact(ours, F.crop(padded, int(p["top"]), int(p["left"]), 64, 64), "pad_if_needed")
    assert_exact(T.apply(img, T.RandomVerticalFlip(1.0))[0], F.vflip(img), "vflip")
    assert_exact(T.apply(img, T.CenterCrop((50, 70)))[0], F.center_crop(img, [50, 70]), "center crop")
    assert_exact(T.apply(small, T.CenterCrop(64))[0], F.center_crop(small, [64, 64]), "center crop, padded")
    assert_within_one_level(T.apply(img, T.Resize((50, 70)))[0], F.resize(img, [50, 70]), "resize")


@pytest.mark.parametrize("make", [lambda: T.RandAugment(), lambda: T.TrivialAugmentWide(), lambda: T.AutoAugment(),
                                  lambda: T.AutoAugment("cifar10"),
                                  lambda: T.RandAugment(3, 15, interpolation="bilinear", fill=128)])
def test_auto_augment_family_matches_torchvision(photos, make):
    step = make()
    seen = set()
    for i in range(40):
        img = photos[i % len(photos)].resize((96, 80))
        ours, trace = T.apply(img, step, sample=i)
        p = trace["steps"][0]
        ref, k = img, 0
        interpolation = mode(step._words["interpolation"])
        fill = step._args["fill"]
        while "op%d" % k in p:
            if p.get("applied%d" % k, 1):
                name = T.AUGMENT_OPS[int(p["op%d" % k])]
                seen.add(name)
                ref = _apply_op(ref, name, p["magnitude%d" % k], interpolation, [fill] * 3 if fill else None)
            k += 1
        assert_exact(ours, ref, "%s %r" % (step._name, p))
    assert len(seen) >= 5, seen  # the draws cover many operations


def test_rand_augment_magnitudes_are_torchvisions_table(photos):
    # magnitude 9 of 31 bins: Rotate 9 degrees, ShearX 0.09, Solarize 181 (torch.linspace in float32).
    table = {"Rotate": float(torch.linspace(0.0, 30.0, 31)[9]), "ShearX": float(torch.linspace(0.0, 0.3, 31)[9]),
             "Solarize": float(torch.linspace(255.0, 0.0, 31)[9]),
             "Posterize": float(8 - (torch.arange(31) / ((31 - 1) / 4)).round().int()[9])}
    found = {}
    for i in range(200):
        p = T.apply(photos[0].resize((32, 32)), T.RandAugment(num_ops=1), sample=i)[1]["steps"][0]
        found[T.AUGMENT_OPS[int(p["op0"])]] = abs(p["magnitude0"])
    for name, value in table.items():
        assert found[name] == pytest.approx(value, abs=1e-6), name


def test_compose_runs_every_stage_as_torchvision_does(demo_images, photos):
    jpeg = sorted(demo_images.rglob("*.JPEG"))[0].read_bytes()
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    c = T.Compose([T.RandomRotation(15, interpolation="bilinear"), T.RandomResizedCrop(160),
                   T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                   T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD), T.RandomErasing(p=1.0, value=(0.5, 0.0, -0.5))])
    for s in range(4):
        ours, trace = T.apply(jpeg, c, seed=7, sample=s)
        rotation, jitter, erase = trace["steps"]
        ref = F.rotate(img, rotation["angle"], interpolation=InterpolationMode.BILINEAR)
        x0, y0, x1, y1 = (int(v) for v in trace["box"])
        ref = F.resized_crop(ref, y0, x0, y1 - y0, x1 - x0, [160, 160])
        if trace["flipped"]:
            ref = F.hflip(ref)
        for k in (int(jitter["order%d" % k]) for k in range(4)):
            if k < 3:
                ref = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation][k](
                    ref, jitter[["brightness", "contrast", "saturation"][k]])
        ref = F.normalize(F.to_tensor(ref), T.IMAGENET_MEAN, T.IMAGENET_STD)
        if erase["erase"]:
            ref = F.erase(ref, int(erase["top"]), int(erase["left"]), int(erase["height"]), int(erase["width"]),
                          torch.tensor([0.5, 0.0, -0.5])[:, None, None])
        assert float((ours - ref).abs().max()) < 1e-5
        # The whole trace replays the sample under another seed; that seed alone draws something else.
        again, _ = T.apply(jpeg, c, seed=8, sample=s, params=trace)
        other, _ = T.apply(jpeg, c, seed=8, sample=s)
        assert torch.equal(again, ours) and not torch.equal(other, ours)


def test_resizes_follow_the_installed_pillows_pass_order():
    """Pillow 13 runs the vertical pass first when the height shrinks by more
    than twice as many pixels as the width; stoker follows the installed
    Pillow, so a 174x196 -> 160x160 resize (such a shape) is torchvision's
    exactly, and the other release's order is not."""
    import PIL
    installed = 13 if int(PIL.__version__.split(".")[0]) >= 13 else 12
    assert T.resize_like_pillow() == installed
    rng = np.random.default_rng(5)
    img = Image.fromarray(rng.integers(0, 256, (196, 174, 3), dtype=np.uint8))
    ref = torch.from_numpy(np.array(F.resize(img, [160, 160], interpolation=InterpolationMode.BILINEAR)))
    ours, _ = T.apply(img, T.Resize((160, 160)))
    assert torch.equal(ours, ref)
    try:
        T.resize_like_pillow(25 - installed)  # the other one
        other, _ = T.apply(img, T.Resize((160, 160)))
    finally:
        T.resize_like_pillow(installed)
    assert not torch.equal(other, ref)
    assert int((other.int() - ref.int()).abs().max()) == 1


def test_without_a_crop_stage_the_steps_fix_the_size(photos):
    cifar = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    img = photos[0].resize((32, 32))
    ours, trace = T.apply(img, cifar, dtype="uint8", sample=3)
    crop, flip = trace["steps"]
    ref = F.crop(F.pad(img, 4), int(crop["top"]), int(crop["left"]), 32, 32)
    if flip["flip"]:
        ref = F.hflip(ref)
    assert_exact(ours, ref, "cifar")
    with pytest.raises(ValueError, match="fixed size"):
        T.Compose([T.RandomRotation(10), T.ColorJitter(0.2)])
    with pytest.raises(ValueError, match="change the"):
        T.Compose([T.RandomResizedCrop(64), T.RandomRotation(10, expand=True)])
    with pytest.raises(ValueError, match="after Normalize"):
        T.Compose([T.RandomResizedCrop(64), T.RandomErasing(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])


@pytest.mark.parametrize("make, message", [
    (lambda: T.RandomRotation(-5), "degrees"),
    (lambda: T.RandomRotation((10, -10)), "min <= max"),
    (lambda: T.RandomRotation(5, interpolation="bicubic"), "interpolation"),
    (lambda: T.RandomAffine(0, scale=(0, 1)), "scale"),
    (lambda: T.RandomAffine(0, translate=(1.5, 0)), "translation"),
    (lambda: T.ColorJitter(hue=0.7), "hue"),
    (lambda: T.ColorJitter(brightness=-1), "brightness"),
    (lambda: T.RandomVerticalFlip(1.5), "probability"),
    (lambda: T.RandomErasing(p=-0.1), "probability"),
    (lambda: T.RandomErasing(scale=(0.5, 2)), "scale"),
    (lambda: T.RandomErasing(value="noise"), "random"),
    (lambda: T.GaussianBlur(4), "odd"),
    (lambda: T.GaussianBlur(3, sigma=-1), "sigma"),
    (lambda: T.Pad(-1), "padding"),
    (lambda: T.Pad(2, padding_mode="wrap"), "padding_mode"),
    (lambda: T.Grayscale(1), "num_output_channels"),
    (lambda: T.RandAugment(magnitude=31), "magnitude"),
    (lambda: T.AutoAugment("mnist"), "policy"),
    (lambda: T.RandomChoice([T.RandomVerticalFlip()], p=[1, 2]), "p"),
    (lambda: T.MixUp(alpha=0, num_classes=3), "alpha"),
    (lambda: T.CutMix(num_classes=0), "num_classes"),
])
def test_bad_arguments_are_refused_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_replays_are_checked(photos):
    with pytest.raises(ValueError, match="lack 'angle'"):
        T.apply(photos[0], T.RandomRotation(5), params=[{"name": "RandomRotation"}])
    with pytest.raises(ValueError, match="no parameter 'angel'"):
        T.apply(photos[0], T.RandomRotation(5), params=[{"name": "RandomRotation", "angle": 1, "angel": 2}])
    with pytest.raises(ValueError, match="given to step"):
        T.apply(photos[0], T.RandomRotation(5), params=[{"name": "ColorJitter"}])
    with pytest.raises(stoker.CorruptionError, match="smaller than the crop"):
        T.apply(photos[0].resize((20, 20)), T.RandomCrop(32))
    # No step grows an image past Pillow's pixel limit (a pad of 60,000 would make 14 GB).
    with pytest.raises(stoker.CorruptionError, match="over the limit"):
        T.apply(photos[0].resize((20, 20)), T.Pad(60000))
    with pytest.raises(stoker.CorruptionError, match="limit"):
        T.apply(photos[0].resize((20, 20)), T.RandomCrop(8, padding=60000))


def test_random_apply_and_choice(photos):
    img = photos[0].resize((64, 48))
    choice = T.RandomChoice([T.RandomVerticalFlip(1.0), T.Grayscale(3)], p=[1, 3])
    picks = [T.apply(img, choice, sample=i)[1]["steps"][0] for i in range(200)]
    counts = [sum(p["index"] == k for p in picks) for k in (0, 1)]
    assert 25 <= counts[0] <= 75, counts  # weights 1:3
    for p in picks[:4]:
        ours, _ = T.apply(img, choice, params=[p])
        assert_exact(ours, F.vflip(img) if p["index"] == 0 else F.rgb_to_grayscale(img, 3), "choice")
    wrapped = T.RandomApply([T.RandomRotation(30), T.ColorJitter(0.3)], p=0.5)
    applied = 0
    for i in range(20):
        ours, trace = T.apply(img, wrapped, sample=i)
        p = trace["steps"][0]
        if not p["applied"]:
            assert_exact(ours, img, "not applied")
            continue
        applied += 1
        rotation, jitter = p["children"]
        ref = F.adjust_brightness(F.rotate(img, rotation["angle"]), jitter["brightness"])
        assert_exact(ours, ref, "applied")
    assert 3 <= applied <= 17


def test_mixup_and_cutmix_follow_torchvision_v2():
    images, labels = torch.rand(6, 3, 20, 24), torch.tensor([0, 1, 2, 3, 4, 0])
    mixup = T.MixUp(alpha=0.8, num_classes=5, seed=1)
    mixed, soft = mixup(images, labels)
    lam = mixup.last["lam"]
    assert torch.allclose(mixed, images * lam + images.roll(1, 0) * (1 - lam))
    assert torch.allclose(soft.sum(1), torch.ones(6))
    assert soft[1, 1] == pytest.approx(lam) and soft[1, 0] == pytest.approx(1 - lam)
    cutmix = T.CutMix(alpha=1.0, num_classes=5, seed=2)
    for _ in range(5):
        cut, soft = cutmix(images, labels)
        x1, y1, x2, y2 = cutmix.last["box"]
        kept = 1 - (x2 - x1) * (y2 - y1) / (20 * 24)
        assert cutmix.last["lam"] == pytest.approx(kept)
        assert torch.equal(cut[..., y1:y2, x1:x2], images.roll(1, 0)[..., y1:y2, x1:x2])
        outside = torch.ones(20, 24, dtype=torch.bool)
        outside[y1:y2, x1:x2] = False
        assert torch.equal(cut[..., outside], images[..., outside])
        assert soft[2, 2] == pytest.approx(kept)
    assert torch.equal(images, images.clone())  # the input batch is left as it was
    with pytest.raises(ValueError, match="labels must be in"):
        mixup(images, torch.tensor([0, 1, 2, 3, 4, 9]))
    with pytest.raises(ValueError, match="floating-point"):
        mixup(images.to(torch.uint8), labels)


@pytest.fixture(scope="module")
def packed(cli, demo_images, tmp_path_factory):
    out = tmp_path_factory.mktemp("augment") / "packed"
    cli("pack", demo_images, out, "--shard-size", "1MiB")
    return out


def test_loader_runs_the_steps_the_same_on_any_thread_count(packed):
    transform = T.Compose([T.RandomRotation(10), T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                           T.RandAugment(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD), T.RandomErasing()])

    def epoch(threads):
        loader = stoker.Loader(packed, batch_size=8, transform=transform, seed=5, num_threads=threads,
                               with_indices=True, log_epochs=False)
        return [(images.clone(), indices.clone()) for images, labels, indices in loader]

    one, two = epoch(1), epoch(2)
    assert len(one) == len(two) == 6
    for (a, ia), (b, ib) in zip(one, two):
        assert torch.equal(ia, ib) and torch.equal(a, b)
    # Each sample is what apply() gives for its dataset index.
    raw = stoker.Loader(packed, batch_size=48, shuffle=False, fields={"jpg": stoker.Bytes("jpg;jpeg")}, log_epochs=False)
    encoded = next(iter(raw))["jpg"]
    images, indices = one[0]
    assert images.shape == (8, 3, 64, 64) and math.isfinite(float(images.abs().sum()))
    for k in range(3):
        index = int(indices[k])
        alone, _ = T.apply(encoded[index], transform, seed=5, epoch=0, sample=index)
        assert torch.equal(alone, images[k])


def test_loader_batch_transform(packed):
    loader = stoker.Loader(packed, batch_size=8, batch_transform=T.CutMix(num_classes=6, seed=0), log_epochs=False)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 224, 224) and labels.shape == (8, 6)
    assert torch.allclose(labels.sum(1), torch.ones(8))
    with pytest.raises(ValueError, match="batch_transform"):
        stoker.Loader(packed, batch_transform=T.CutMix(num_classes=6), fields={"image": stoker.Image()})


def test_warps_before_the_crop_decode_only_what_the_crop_needs_with_the_same_pixels(demo_images):
    # Encoded input takes the partial path (decode the source region the warps read, draw only the crop's
    # part of each warp); pixels already decoded take the whole image. They must agree exactly.
    recipes = [T.Compose([T.RandomRotation(15), T.RandomResizedCrop(160), T.RandomHorizontalFlip()]),
               T.Compose([T.RandomRotation(30, interpolation="bilinear", expand=True), T.RandomVerticalFlip(),
                          T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=5),
                          T.RandomResizedCrop(96), T.ColorJitter(0.3)], dct_scaling=False),
               T.Compose([T.RandomAffine(20, interpolation="bilinear", fill=100),
                          T.RandomResizedCrop(48, scale=(0.01, 0.05))])]
    for k, path in enumerate(sorted(demo_images.rglob("*.JPEG"))[:16]):
        jpeg = path.read_bytes()
        pixels = stoker.decode_image(jpeg).numpy()
        for transform in recipes:
            partial, trace = T.apply(jpeg, transform, dtype="uint8", sample=k)
            whole, whole_trace = T.apply(pixels, transform, dtype="uint8", sample=k)
            assert torch.equal(partial, whole) and trace["box"] == whole_trace["box"], (path, transform)
    # A rotation by exactly 90 degrees is Pillow's transpose, not a warp: the whole path, same result.
    jpeg = sorted(demo_images.rglob("*.JPEG"))[0].read_bytes()
    square = T.Compose([T.RandomRotation(90, expand=True), T.RandomResizedCrop(64)])
    replay = {"steps": [{"name": "RandomRotation", "angle": 90.0}]}
    a, _ = T.apply(jpeg, square, dtype="uint8", params=replay)
    b, _ = T.apply(stoker.decode_image(jpeg).numpy(), square, dtype="uint8", params=replay)
    assert torch.equal(a, b)
