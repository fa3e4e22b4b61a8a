"""TIFFs as arrays (stoker.Array over a .tif field, stoker.decode_array):
tifffile's own files, in every sample type, count, layout, byte order and
the compressions it writes without imagecodecs, decode to what
tifffile.imread gives; pages stack, overviews are skipped; through the
loader, stacked or padded like .npy arrays; refusals name what and where.
(tests/codec/tiff_array_test.cc covers LZW, PackBits, ZSTD and the
floating-point predictor, written with libtiff.)"""
import io
import json
import re

import numpy as np
import pytest
import tifffile  # Debian's python3-tifffile (scripts/deps)
import torch

import stoker

rng = np.random.default_rng(23)

# What torch 1.13 holds each NumPy type as (stoker.decode_npy's rule).
WIDENED = {"uint16": np.int32, "uint32": np.int64, "uint64": np.int64}


def tiff(array, **kw):
    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kw)
    return buf.getvalue()


def random_array(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    high = min(int(info.max), 2**62)  # uint64 past int64's range is refused, as by decode_npy
    return rng.integers(int(info.min), high, shape, dtype=dtype, endpoint=True)


def same_as_tifffile(data, **kw):
    expected = tifffile.imread(io.BytesIO(data))
    got = stoker.decode_array(data, **kw)
    assert tuple(got.shape) == expected.shape
    expected = expected.astype(WIDENED.get(expected.dtype.name, expected.dtype), copy=False)
    assert got.numpy().dtype == expected.dtype
    np.testing.assert_array_equal(got.numpy(), expected)
    return got


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                   "float16", "float32", "float64"])
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_every_sample_type_in_both_byte_orders(dtype, byteorder):
    same_as_tifffile(tiff(random_array((19, 23), dtype), byteorder=byteorder))
    same_as_tifffile(tiff(random_array((19, 23, 13), dtype), byteorder=byteorder, photometric="minisblack",
                          planarconfig="contig"))


@pytest.mark.parametrize("layout", [
    dict(photometric="minisblack", planarconfig="separate"),                  # [S, H, W]
    dict(photometric="minisblack", planarconfig="contig", tile=(16, 16)),     # tiles overhanging the edges
    dict(photometric="minisblack", planarconfig="separate", tile=(16, 16)),
    dict(photometric="minisblack", planarconfig="contig", rowsperstrip=3),
    dict(photometric="minisblack", planarconfig="contig", compression="zlib"),
    dict(photometric="minisblack", planarconfig="contig", compression="zlib", predictor=True),
    dict(photometric="minisblack", planarconfig="separate", compression="lzma", tile=(32, 16)),
    dict(photometric="rgb"),                                                  # colour is three samples
])
def test_layouts_compressions_and_predictors(layout):
    bands = 4 if layout.get("photometric") != "rgb" else 3
    shape = (bands, 37, 45) if layout.get("planarconfig") == "separate" else (37, 45, bands)
    for dtype in ("uint16", "float32", "int8"):
        if layout.get("predictor") and dtype == "float32":
            continue  # the floating-point predictor needs imagecodecs; the C++ test writes it with libtiff
        same_as_tifffile(tiff(random_array(shape, dtype), **layout))


def test_pages_stack_and_overviews_are_skipped():
    volume = random_array((5, 17, 21), "uint16")
    same_as_tifffile(tiff(volume, photometric="minisblack"))  # a page a slice: [5, 17, 21]
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as writer:
        for page in volume:  # pages written one by one, as generic tools do (no tifffile metadata)
            writer.write(page, photometric="minisblack", contiguous=False, metadata=None)
    same_as_tifffile(buf.getvalue())
    # A cloud-optimised GeoTIFF's shape: the image, then reduced-resolution copies.
    image = random_array((64, 48, 3), "int16")
    buf = io.BytesIO()
    with tifffile.TiffWriter(buf) as writer:
        writer.write(image, photometric="minisblack", planarconfig="contig", tile=(16, 16))
        writer.write(image[::2, ::2], photometric="minisblack", planarconfig="contig", tile=(16, 16), subfiletype=1)
        writer.write(image[::4, ::4], photometric="minisblack", planarconfig="contig", tile=(16, 16), subfiletype=1)
    got = stoker.decode_array(buf.getvalue())
    np.testing.assert_array_equal(got.numpy(), image)


def test_palette_gives_its_indices_as_tifffile_does():
    indices = random_array((12, 14), "uint8")
    colormap = rng.integers(0, 65536, (3, 256), dtype=np.uint16)
    got = same_as_tifffile(tiff(indices, photometric="palette", colormap=colormap))
    np.testing.assert_array_equal(got.numpy(), indices)


def test_what_is_not_loaded_is_refused_by_name():
    with pytest.raises(stoker.StokerError, match="1-bit samples \\(stoker.Image unpacks"):
        stoker.decode_array(tiff(random_array((8, 9), "uint8") > 100))
    with pytest.raises(stoker.StokerError, match="64-bit complex floating-point samples"):
        stoker.decode_array(tiff((random_array((8, 9), "float32") * 1j).astype(np.complex64)))
    pages = io.BytesIO()
    with tifffile.TiffWriter(pages) as writer:
        writer.write(random_array((8, 9), "uint16"), photometric="minisblack")
        writer.write(random_array((8, 10), "uint16"), photometric="minisblack")
    with pytest.raises(stoker.CorruptionError, match="page 1 \\(10x8, 1 uint16 sample a pixel\\) differs"):
        stoker.decode_array(pages.getvalue())
    data = tiff(random_array((30, 40, 6), "float32"), photometric="minisblack", planarconfig="contig")
    with pytest.raises(stoker.CorruptionError, match="decompression bomb"):
        stoker.decode_array(data, max_pixels=1000)
    assert stoker.decode_array(data, max_pixels=0).shape == (30, 40, 6)
    with pytest.raises(stoker.CorruptionError, match="TIFF"):
        stoker.decode_array(data[:len(data) // 2])


def test_the_loader_stacks_pads_and_names_tiffs(tmp_path):
    same = [random_array((16, 20, 13), "uint16") for _ in range(6)]
    ragged = [random_array((10 + i, 12, 2), "float32") for i in range(6)]
    with stoker.DatasetWriter(tmp_path / "bands") as writer:
        for i in range(6):
            writer.write({"__key__": "s%d" % i, "tif": tiff(same[i], photometric="minisblack", planarconfig="contig"),
                          "dem.tiff": tiff(ragged[i], photometric="minisblack", planarconfig="contig",
                                           compression="zlib"),
                          "cls": i % 2})
    loader = stoker.Loader(tmp_path / "bands", batch_size=3, shuffle=False, fields={
        "bands": stoker.Array(key="tif"), "dem": stoker.Array(key="dem.tiff", pad=float("nan")),
        "label": stoker.Int("cls")})
    batches = list(loader)
    assert len(batches) == 2
    for b, batch in enumerate(batches):
        assert batch["bands"].dtype == torch.int32 and tuple(batch["bands"].shape) == (3, 16, 20, 13)
        for j in range(3):
            i = 3 * b + j
            np.testing.assert_array_equal(batch["bands"][j].numpy(), same[i].astype(np.int32))
            rows = ragged[i].shape[0]
            assert batch["dem_shape"][j].tolist() == list(ragged[i].shape)
            np.testing.assert_array_equal(batch["dem"][j, :rows].numpy(), ragged[i])
            assert torch.isnan(batch["dem"][j, rows:]).all()
    # An image spec over these bands says what reads them.
    images = stoker.Loader(tmp_path / "bands", batch_size=3, shuffle=False,
                           fields={"bands": stoker.Image(keys="tif", transform=None)})
    with pytest.raises(stoker.StokerError, match="sample 's0' \\(field 'bands', key 'tif' at shard-000000.tar:\\d+\\).*"
                                                 "13 samples a pixel.*stoker.Array"):
        next(iter(images))
    # An Array over a JPEG field is still refused when the loader is made.
    with stoker.DatasetWriter(tmp_path / "photos") as writer:
        writer.write({"jpg": np.zeros((8, 8, 3), np.uint8)})
    with pytest.raises(ValueError, match="field 'x' \\(array\\) reads key 'jpg'.*records as image"):
        stoker.Loader(tmp_path / "photos", batch_size=1, fields={"x": stoker.Array(key="jpg")})


@pytest.mark.parametrize("mode,compression", [
    (mode, compression) for mode in ("L", "RGB", "I;16")
    for compression in (None, "tiff_lzw", "tiff_adobe_deflate", "packbits", "jpeg")
    if not (mode == "I;16" and compression == "jpeg")])  # Pillow writes no such TIFF
def test_pillow_written_tiffs_read_as_pillow_reads_their_samples(mode, compression):
    """Pillow is the reference for what tifffile cannot write here (LZW,
    PackBits, JPEG): samples as np.array(Image.open(f)) holds them."""
    from PIL import Image
    if mode == "I;16":
        image = Image.fromarray(random_array((21, 33), "uint16"))
    else:
        image = Image.fromarray(random_array((21, 33, 3), "uint8")).convert(mode)
    buf = io.BytesIO()
    image.save(buf, "TIFF", compression=compression)
    expected = np.array(Image.open(io.BytesIO(buf.getvalue())))
    got = stoker.decode_array(buf.getvalue()).numpy()
    np.testing.assert_array_equal(got, expected.astype(WIDENED.get(expected.dtype.name, expected.dtype)))


def test_a_packed_tree_of_band_tiffs_verifies_and_loads(cli, tmp_path):
    """An ImageFolder tree of 13-band TIFFs (EuroSAT MS's shape) packs as
    images; verify --decode reads them as arrays, and names the one no
    decoder loads."""
    tree = tmp_path / "tree"
    truth = {}
    for i in range(4):
        (tree / ("c%d" % (i % 2))).mkdir(parents=True, exist_ok=True)
        truth["c%d/%d" % (i % 2, i)] = random_array((8, 6, 13), "uint16")
        tifffile.imwrite(tree / ("c%d" % (i % 2)) / ("%d.tif" % i), truth["c%d/%d" % (i % 2, i)],
                         photometric="minisblack", planarconfig="contig")
    cli("pack", tree, tmp_path / "packed")
    result = cli("verify", "--decode", tmp_path / "packed")
    assert "decoded 8 fields (4 TIFFs of samples no image mode holds as arrays" in result.stdout
    assert ("TIFFs no image mode holds (the first: [8, 6, 13] uint16): read them with stoker.Array(key=\"tif\")"
            in cli("inspect", tmp_path / "packed").stdout)
    fields = {f["name"]: f for f in json.loads(cli("inspect", "--json", tmp_path / "packed").stdout)["fields"]}
    assert fields["tif"]["tiff_arrays"] == {"first_shape": [8, 6, 13], "dtype": "uint16"}
    assert "tiff_arrays" not in fields["cls"]
    loader = stoker.Loader(tmp_path / "packed", batch_size=4, shuffle=False,
                           fields={"bands": stoker.Array(key="tif"), "label": stoker.Int("cls")})
    batch = next(iter(loader))  # the packed order: by class folder, then file name
    assert batch["label"].tolist() == [0, 0, 1, 1]
    for j, key in enumerate(sorted(truth)):
        np.testing.assert_array_equal(batch["bands"][j].numpy(), truth[key].astype(np.int32))
    tifffile.imwrite(tree / "c0" / "complex.tif", np.zeros((4, 4), np.complex64))
    cli("pack", tree, tmp_path / "packed", "--force")
    result = cli("verify", "--decode", tmp_path / "packed", check=False)
    assert result.returncode != 0
    assert re.search(r"CORRUPT shard-000000.tar:\d+ sample 'c0/complex': field 'tif' \(image\) does not decode: "
                     r"TIFF: 64-bit complex floating-point samples", result.stderr), result.stderr


def test_the_writer_stores_band_arrays_as_tiffs_that_read_back(tmp_path):
    bands = random_array((9, 7, 13), "uint16")
    heights = random_array((9, 7), "float32")
    signed = random_array((5, 4, 2), "int16")
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        writer.write({"tif": bands, "dem.tiff": heights, "s.tif": torch.from_numpy(signed)})
        with pytest.raises(ValueError, match="a TIFF array must be \\(H, W\\) or \\(H, W, bands\\)"):
            writer.write({"tif": np.zeros((2, 3, 4, 5), np.uint8)})
    batch = next(iter(stoker.Loader(tmp_path / "out", batch_size=1, fields={
        "bands": stoker.Array("tif"), "dem": stoker.Array("dem.tiff"), "s": stoker.Array("s.tif")})))
    np.testing.assert_array_equal(batch["bands"][0].numpy(), bands.astype(np.int32))
    np.testing.assert_array_equal(batch["dem"][0].numpy(), heights)
    np.testing.assert_array_equal(batch["s"][0].numpy(), signed)


def test_array_transforms_crop_flip_and_normalize_bands_and_their_labels_alike(tmp_path):
    T = stoker.transforms
    bands = [random_array((12, 10, 4), "uint16") for _ in range(8)]
    labels = [random_array((12, 10), "uint8") for _ in range(8)]
    with stoker.DatasetWriter(tmp_path / "seg") as writer:
        for i in range(8):
            writer.write({"__key__": "%02d" % i, "tif": bands[i], "mask.tif": labels[i]})
    mean, std = [1000.0, 2000.0, 3000.0, 4000.0], [10.0, 20.0, 30.0, 40.0]
    steps = [T.RandomCrop((6, 5)), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]

    def batches(seed, epochs=1):
        loader = stoker.Loader(tmp_path / "seg", batch_size=8, shuffle=False, seed=seed, fields={
            "bands": stoker.Array("tif", transform=steps + [T.Normalize(mean, std)]),
            "mask": stoker.Array("mask.tif", transform=steps)})
        out = []
        for _ in range(epochs):
            out += list(loader)
        return out

    batch = batches(3)[0]
    assert batch["bands"].dtype == torch.float32 and tuple(batch["bands"].shape) == (8, 6, 5, 4)
    assert batch["mask"].dtype == torch.uint8 and tuple(batch["mask"].shape) == (8, 6, 5)
    draws = set()
    for i in range(8):
        found = []
        for top in range(12 - 6 + 1):
            for left in range(10 - 5 + 1):
                for h in (False, True):
                    for v in (False, True):
                        window = labels[i][top:top + 6, left:left + 5]
                        window = window[:, ::-1] if h else window
                        window = window[::-1] if v else window
                        if np.array_equal(batch["mask"][i].numpy(), window):
                            found.append((top, left, h, v))
        assert len(found) >= 1, i
        top, left, h, v = found[0]
        draws.add(found[0])
        window = bands[i][top:top + 6, left:left + 5]
        window = window[:, ::-1] if h else window
        window = window[::-1] if v else window
        # The same draws as the mask; normalised exactly as torchvision's Normalize on a float32 tensor.
        expected = (torch.from_numpy(window.astype(np.float32)) - torch.tensor(mean)) / torch.tensor(std)
        assert torch.equal(batch["bands"][i], expected)
    assert len(draws) > 4
    # Every kind of draw happens (fixed seed: the same draws every run).
    assert {d[2] for d in draws} == {False, True} and {d[3] for d in draws} == {False, True}
    assert max(d[0] for d in draws) > 3 and max(d[1] for d in draws) > 2, draws
    again = batches(3)[0]
    assert torch.equal(again["bands"], batch["bands"]) and torch.equal(again["mask"], batch["mask"])
    first, second = batches(3, epochs=2)
    assert not torch.equal(first["mask"], second["mask"])  # each epoch draws anew
    # What an Array's transform does not take, and arrays smaller than the crop, are named.
    with pytest.raises(TypeError, match="an Array's transform takes RandomCrop, CenterCrop"):
        stoker.Array("tif", transform=[T.RandomRotation(10)])
    with pytest.raises(ValueError, match="takes no padding"):
        stoker.Array("tif", transform=[T.RandomCrop(4, padding=2)])
    with pytest.raises(ValueError, match="layout"):
        stoker.Array("tif", layout="WHC")
    with pytest.raises(ValueError, match="3 means and 3 stds for an array of 4 bands"):
        next(iter(stoker.Loader(tmp_path / "seg", batch_size=8, fields={
            "bands": stoker.Array("tif", transform=[T.Normalize(mean[:3], std[:3])])})))
    with pytest.raises(ValueError, match="sample '\\d\\d' \\(field 'bands'.*RandomCrop of 20x20 from an array of 12x10"):
        next(iter(stoker.Loader(tmp_path / "seg", batch_size=8, fields={
            "bands": stoker.Array("tif", transform=[T.RandomCrop(20)])})))
    with pytest.raises(ValueError, match="an image's Normalize needs three means"):
        T.Compose([T.RandomResizedCrop(8), T.Normalize(mean, std)])


def test_band_stats_match_numpy_over_the_dataset(tmp_path):
    arrays = [random_array((9 + i % 3, 7, 5), "uint16") for i in range(11)]
    with stoker.DatasetWriter(tmp_path / "bands") as writer:
        for i, a in enumerate(arrays):
            writer.write({"__key__": "%02d" % i, "tif": a, "planar.tif": np.ascontiguousarray(np.moveaxis(a, 2, 0))})
    flat = np.concatenate([a.reshape(-1, 5) for a in arrays]).astype(np.float64)
    stats = stoker.band_stats(tmp_path / "bands", key="tif", batch_size=4)
    assert stats["samples"] == 11 and stats["values"] == flat.shape[0]
    np.testing.assert_allclose(stats["mean"], flat.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], flat.std(0), rtol=1e-9)
    assert stats["min"] == flat.min(0).tolist() and stats["max"] == flat.max(0).tolist()
    # Bands first (a planar layout), and the first samples only.
    planar = stoker.band_stats(tmp_path / "bands", key="planar.tif", layout="CHW", max_samples=3)
    first = np.concatenate([a.reshape(-1, 5) for a in arrays[:3]]).astype(np.float64)
    assert planar["samples"] == 3
    np.testing.assert_allclose(planar["mean"], first.mean(0), rtol=1e-12)
    np.testing.assert_allclose(planar["std"], first.std(0), rtol=1e-9)
    with pytest.raises(ValueError, match="layout"):
        stoker.band_stats(tmp_path / "bands", layout="HW")
