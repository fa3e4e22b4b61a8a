"""Resize in an Array's transform, against torchvision's tensor resize
(torchvision.transforms.functional.resize on the array as a [C, H, W]
tensor): nearest equal for every dtype and layout; bilinear (antialiased,
as torchvision.transforms.v2 resizes tensors and Pillow images) within
float rounding for float arrays, and for integer arrays rounded back the
same on at least 99.9% of values and never more than 1 apart."""
import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode

import stoker

T = stoker.transforms
rng = np.random.default_rng(31)
WIDENED = {"uint16": np.int32, "uint32": np.int64}


def arrays_of(dtype, shape, n=6):
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(shape).astype(dtype) * 100 for _ in range(n)]
    info = np.iinfo(dtype)
    # Within float32's exact integers: torchvision 0.14 resizes integer
    # tensors through float32, even by nearest (stoker copies the values).
    return [rng.integers(max(info.min, -2**24), min(info.max, 2**24), shape, endpoint=True).astype(dtype)
            for _ in range(n)]


def loaded(tmp_path, arrays, steps, layout="HWC", key="npy"):
    folder = tmp_path / ("data-%s-%s" % (arrays[0].dtype.name, layout))
    with stoker.DatasetWriter(folder) as writer:
        for i, a in enumerate(arrays):
            writer.write({"__key__": "%02d" % i, key: a})
    loader = stoker.Loader(folder, batch_size=len(arrays), shuffle=False, log_epochs=False,
                           fields={"x": stoker.Array(key, transform=steps, layout=layout)})
    batch = next(iter(loader))["x"]
    return [batch[i] for i in range(len(arrays))] if isinstance(batch, torch.Tensor) else batch


def reference(array, size, interpolation, layout):
    t = torch.from_numpy(array.astype(WIDENED.get(array.dtype.name, array.dtype)))
    chw = t if layout == "CHW" else (t[None] if t.dim() == 2 else t.permute(2, 0, 1))
    out = F.resize(chw, size, interpolation, antialias=interpolation == InterpolationMode.BILINEAR)
    return out if layout == "CHW" else (out[0] if t.dim() == 2 else out.permute(1, 2, 0))


SIZES = [(16, 23), (41, 29), 19, (37, 53)]  # down, up, the shorter side, the same size


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int32", "float16", "float32", "float64", "bool"])
@pytest.mark.parametrize("layout, shape", [("HWC", (37, 53)), ("HWC", (37, 53, 3)), ("CHW", (2, 37, 53))])
def test_nearest_equals_torchvision_for_every_dtype_and_layout(tmp_path, dtype, layout, shape):
    arrays = [a > 0 for a in arrays_of("float32", shape)] if dtype == "bool" else arrays_of(dtype, shape)
    for size in SIZES:
        got = loaded(tmp_path / str(size), arrays, [T.Resize(size, interpolation="nearest")], layout)
        for a, g in zip(arrays, got):
            expected = reference(a if dtype != "float16" else a.astype(np.float32), size, InterpolationMode.NEAREST,
                                 layout)
            assert torch.equal(g.float() if dtype == "float16" else g, expected.to(g.dtype)
                               if dtype != "float16" else expected), (size, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout, shape", [("HWC", (37, 53)), ("HWC", (37, 53, 4)), ("CHW", (3, 37, 53))])
def test_bilinear_floats_match_torchvision_antialiased(tmp_path, dtype, layout, shape):
    arrays = arrays_of(dtype, shape)
    for size in SIZES:
        got = loaded(tmp_path / str(size), arrays, [T.Resize(size)], layout)
        for a, g in zip(arrays, got):
            expected = reference(a, size, InterpolationMode.BILINEAR, layout)
            assert g.dtype == expected.dtype and g.shape == expected.shape
            torch.testing.assert_close(g, expected, rtol=1e-5, atol=1e-3 if dtype == "float32" else 1e-9)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16", "int32"])
def test_bilinear_integers_round_back_as_torchvision(tmp_path, dtype):
    # Values float32 holds to an eighth: both sides compute in float32, in
    # another order, so larger ones may differ by its rounding.
    arrays = [np.clip(a, -2**20, 2**20).astype(dtype) for a in arrays_of(dtype, (37, 53, 2))]
    total = off = 0
    for size in SIZES:
        got = loaded(tmp_path / str(size), arrays, [T.Resize(size)])
        for a, g in zip(arrays, got):
            expected = reference(a, size, InterpolationMode.BILINEAR, "HWC")
            assert g.dtype == expected.dtype and g.shape == expected.shape
            diff = (g.long() - expected.long()).abs()
            assert int(diff.max()) <= 1
            total += diff.numel()
            off += int((diff > 0).sum())
    assert off <= total * 0.001, (off, total)
    print("%s: %d of %d values one apart" % (dtype, off, total))


def test_float16_bilinear_and_resize_errors(tmp_path):
    arrays = arrays_of("float16", (37, 53))
    got = loaded(tmp_path, arrays, [T.Resize((16, 23))])
    for a, g in zip(arrays, got):
        expected = reference(a.astype(np.float32), (16, 23), InterpolationMode.BILINEAR, "HWC").half()
        assert g.dtype == torch.float16
        torch.testing.assert_close(g.float(), expected.float(), rtol=2e-3, atol=0.1)
    with pytest.raises(ValueError, match="bool array is nearest"):
        loaded(tmp_path / "b", [a > 0 for a in arrays_of("float32", (8, 9))], [T.Resize(4)])
    with pytest.raises(ValueError, match="interpolation 'nearest' is not supported"):
        T.Compose([T.Resize(8, interpolation="nearest"), T.CenterCrop(8)])  # images resize bilinear or bicubic
    with pytest.raises(ValueError, match="bicubic' is not taken"):
        loaded(tmp_path / "c", arrays_of("float32", (8, 9)), [T.Resize(4, interpolation="bicubic")])
    with pytest.raises(ValueError, match="positive"):
        T.Resize(0, interpolation="nearest")


def test_bands_resized_to_the_grid_take_the_same_crops_and_flips(tmp_path):
    """Sentinel-2 style: 20 m bands stored at half the size of the 10 m
    ones. Resize draws nothing, so after Resize to the 10 m grid the crop
    and flips drawn for them equal the 10 m bands' (the sample's draws)."""
    coarse = [rng.integers(0, 10000, (10, 12, 2)).astype(np.uint16) for _ in range(6)]
    fine = [np.repeat(np.repeat(c, 2, axis=0), 2, axis=1) for c in coarse]  # the same values on the 10 m grid
    with stoker.DatasetWriter(tmp_path / "s2") as writer:
        for i in range(6):
            writer.write({"__key__": "%02d" % i, "b10.npy": fine[i], "b20.npy": coarse[i]})
    crops = [T.RandomCrop(9), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    fields = {"b10": stoker.Array("b10.npy", transform=crops),
              "b20": stoker.Array("b20.npy", transform=[T.Resize((20, 24), interpolation="nearest")] + crops)}
    seen = set()
    for seed in range(4):
        batch = next(iter(stoker.Loader(tmp_path / "s2", batch_size=6, shuffle=False, seed=seed, log_epochs=False,
                                        fields=fields)))
        assert batch["b10"].shape == batch["b20"].shape == (6, 9, 9, 2)
        assert torch.equal(batch["b10"], batch["b20"])
        seen.add(batch["b10"][:, 0, 0, 0].numpy().tobytes())
    assert len(seen) > 1  # the draws do change with the seed
