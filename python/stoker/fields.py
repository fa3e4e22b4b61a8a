"""Typed fields: what ``stoker.Loader(..., fields={...})`` decodes from each
sample, and how a batch of them is put together.

    fields = {
        "image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(224), T.Normalize(mean, std)])),
        "mask": stoker.Image(keys="seg.png", mode="L", transform=None),   # list of uint8 [H, W, 1]
        "boxes": stoker.Json(),                                           # list of Python objects
        "depth": stoker.Array(key="npy", pad=0.0),                        # padded + "depth_shape"
        "caption": stoker.Text(optional=True),                            # list of str (None where absent)
        "id": stoker.Int("id"),                                           # int64 [B]
    }
    for batch in stoker.Loader("coco-packed", batch_size=32, fields=fields):
        batch["image"], batch["mask"], ...

Keys are WebDataset keys (a member ``000123.seg.png`` has key ``seg.png``);
several, separated by ";", are tried in order. Every field is decoded on
the loader's native threads, without the GIL; what is left in Python is
putting tensors together (``torch.stack``, padding) and, for Json, turning
checked JSON text into objects (``json.loads``).
"""
import json
import numbers

from . import _native, _params, transforms
from ._device_mover import DeviceMover  # noqa: F401  (fields.DeviceMover: the loaders' and tests' name)

_MODES = ("RGB", "L", "RGBA", "I;16")


def _keys(keys, what):
    if isinstance(keys, str):
        keys = keys.split(";")
    keys = [k.strip() for k in keys if k and k.strip()]
    if not keys:
        raise ValueError("%s needs at least one key" % what)
    for k in keys:
        if not isinstance(k, str):
            raise TypeError("%s: keys are strings, not %r" % (what, k))
    return keys


class _Field:
    kind = None

    def _sample(self, value):
        """One sample's value as map= sees it."""
        return value

    def __init__(self, keys, optional=False):
        self.keys = _keys(keys, type(self).__name__)
        self.optional = _params.boolean("optional", optional)

    def _spec(self, name):
        spec = _native.FieldSpec()
        spec.name = name
        spec.kind = getattr(_native.FieldKind, self.kind)
        spec.keys = self.keys
        spec.optional = self.optional
        return spec

    def _assemble(self, values, torch, name, out):
        out[name] = values

    def __repr__(self):
        return "stoker.%s(keys=%r%s)" % (type(self).__name__, ";".join(self.keys),
                                         ", optional=True" if self.optional else "")


def _tensor(item):
    from torch.utils.dlpack import from_dlpack
    capsule, stored, _ = item
    t = from_dlpack(capsule)
    return t.bool() if stored == "bool" else t


class Image(_Field):
    """A JPEG, PNG, WebP, TIFF, PGM/PPM or BMP: the first of ``keys`` the sample has. With a
    ``transform`` (a ``stoker.transforms.Compose``) it is cropped, resized
    and normalised like the loader's images and the batch is one tensor (at
    most one such field; mode RGB). With ``transform=None`` it is decoded
    whole in ``mode`` ("RGB", "L", "RGBA", "I;16": Pillow's
    ``Image.open(f).convert(mode)`` pixels) and the batch is a list of uint8
    [H, W, C] tensors at their own sizes (int32 for "I;16")."""
    kind = "image"

    def __init__(self, keys="jpg;jpeg;png;webp;tif;tiff;ppm;pgm;bmp", transform=None, mode="RGB", optional=False):
        super().__init__(keys, optional)
        if transform is not None and not isinstance(transform, transforms.Compose):
            raise TypeError("Image(transform=...) takes a stoker.transforms.Compose, not %s" % type(transform).__name__)
        self.transform = transform
        self.mode = _params.choice("mode", mode, _MODES)
        if transform is not None and self.mode != "RGB":
            raise ValueError("a transformed image is RGB (mode=%r asked)" % mode)
        if transform is not None and self.optional:
            raise ValueError("a transformed image cannot be optional (the batch is one tensor)")

    def _spec(self, name):
        spec = super()._spec(name)
        spec.mode = self.mode
        spec.transformed = self.transform is not None
        return spec

    def _sample(self, value):
        return None if value is None else _tensor(value)

    def _assemble(self, values, torch, name, out):
        out[name] = [self._sample(v) for v in values]


class Int(_Field):
    """A decimal integer stored as text (``.cls``, ``.id``, ...): an int64
    tensor [B] (a list, with None where absent, when optional values are
    missing from the batch)."""
    kind = "int"

    def __init__(self, key="cls", optional=False):
        super().__init__(key, optional)

    def _assemble(self, values, torch, name, out):
        out[name] = values if None in values else torch.tensor(values, dtype=torch.int64)


class Float(_Field):
    """A number stored as text: a float64 tensor [B] (a list when optional
    values are missing)."""
    kind = "float"

    def __init__(self, key, optional=False):
        super().__init__(key, optional)

    def _assemble(self, values, torch, name, out):
        out[name] = values if None in values else torch.tensor(values, dtype=torch.float64)


def _array_steps(transform):
    """The steps of an Array's transform: None, a list or tuple of steps, or
    a Compose."""
    T = transforms
    if transform is None:
        return []
    steps = transform.transforms if isinstance(transform, T.Compose) else transform
    if not isinstance(steps, (list, tuple)):
        raise TypeError("Array(transform=...) is a list of stoker.transforms steps (or a Compose), not %r"
                        % (transform,))
    for t in steps:
        if not isinstance(t, (T.RandomCrop, T.CenterCrop, T.Resize, T.RandomHorizontalFlip, T.RandomVerticalFlip,
                              T.Normalize)):
            raise TypeError("an Array's transform takes RandomCrop, CenterCrop, Resize, RandomHorizontalFlip, "
                            "RandomVerticalFlip and Normalize, not %r" % (t,))
        if isinstance(t, T.RandomCrop) and (t._args.get("padding") is not None or t._args.get("pad_if_needed")):
            raise ValueError("an Array's RandomCrop takes no padding (it crops within the array): %r" % (t,))
    return list(steps)


def _array_step(t):
    if isinstance(t, transforms.Normalize):
        return _native.TransformStep("Normalize", [("mean", list(t.mean)), ("std", list(t.std))], [], [])
    return t._step()


class Array(_Field):
    """A NumPy ``.npy`` (bool, int, uint, float; either order and byte
    order; object arrays are refused), or a TIFF's samples as stored
    (``key="tif"``: multi-band, float, signed; as ``stoker.decode_array``
    decodes them, the shapes ``tifffile.imread`` gives), or a PNG's
    (``key="depth.png"``: 16-bit depth kept whole, palette indices). Arrays of one shape and dtype are
    stacked into one tensor [B, ...]. Otherwise ``pad=value`` pads each to
    the batch's largest shape and adds ``<name>_shape`` (int64 [B, ndim]),
    and ``pad=None`` gives a list. uint16/uint32 arrive as int32/int64
    (torch before 2.3 has no such types).

    ``transform``: steps run on each array on the loader's threads, in
    order: ``RandomCrop(size)`` (no padding), ``CenterCrop(size)``,
    ``Resize(size, interpolation="bilinear"|"nearest")`` (torchvision's
    tensor resize: bilinear antialiased, integers rounded back; nearest
    copies values), ``RandomHorizontalFlip(p)``, ``RandomVerticalFlip(p)`` and
    ``Normalize(mean, std)`` (one value, or one a band; the array becomes
    float32), from ``stoker.transforms``, as a list (or a Compose). The
    height and width are where ``layout`` says: "HWC" ([H, W] or
    [H, W, bands]: TIFFs of contiguous bands, most .npy) or "CHW" (planar
    TIFFs). Draws are the sample's: Array fields of one size given the same
    steps get the same crop and flips (bands and their label map stay
    aligned); an array smaller than a crop is an error naming the sample.

    ``follows="image"``: instead of steps of its own, the array takes every
    crop, flip, rotation, affine and resize the transformed image takes,
    with nearest-neighbour sampling, as a mask does (a depth map, extra
    bands, a float label map beside an RGB image). It must be the image's
    size (height and width where ``layout`` says); values moved in from
    outside take ``fill`` (any number the dtype holds, NaN for floats).
    Values are moved, not changed: the vectors of an optical-flow field
    are not turned with it."""
    kind = "array"

    def __init__(self, key="npy", pad=None, optional=False, transform=None, layout="HWC", follows=None, fill=0):
        super().__init__(key, optional)
        if pad is not None and not isinstance(pad, (int, float, bool)):
            raise TypeError("Array(pad=...) is a number or None, not %r" % (pad,))
        self.pad = pad
        if layout not in ("HWC", "CHW"):
            raise ValueError("Array(layout=...) is \"HWC\" or \"CHW\", not %r" % (layout,))
        self.layout = layout
        self.transform = _array_steps(transform)  # checked natively again when the loader is made
        self.follows = _follows(follows)
        if self.follows and self.transform:
            raise ValueError("an Array that follows the image takes the image's steps, not a transform of its own")
        if isinstance(fill, bool) or not isinstance(fill, numbers.Real):  # numpy scalars too
            raise TypeError("Array(fill=...) is a number, not %r" % (fill,))
        self.fill = fill  # whether its dtype holds it is checked on the first array

    def _spec(self, name):
        spec = super()._spec(name)
        if self.transform or self.follows:
            spec.array_transform = [_array_step(t) for t in self.transform]
            spec.array_layout = self.layout
        spec.follows = self.follows
        spec.fill = float(self.fill)
        return spec

    _sample = Image._sample

    def _assemble(self, values, torch, name, out):
        if isinstance(values, tuple):  # stacked natively: every sample present, of one shape and dtype
            out[name] = _tensor(values)
            return
        tensors = [self._sample(v) for v in values]
        present = [t for t in tensors if t is not None]
        if len(present) < len(tensors) or not present:
            out[name] = tensors
            return
        shapes = {tuple(t.shape) for t in present}
        dtypes = {t.dtype for t in present}
        if len(shapes) == 1 and len(dtypes) == 1:
            out[name] = torch.stack(present)
            return
        if self.pad is None or len(dtypes) != 1 or len({t.dim() for t in present}) != 1:
            out[name] = tensors
            return
        dims = present[0].dim()
        largest = [max(t.shape[d] for t in present) for d in range(dims)]
        batch = torch.full([len(present)] + largest, self.pad, dtype=present[0].dtype)
        for i, t in enumerate(present):
            batch[(i,) + tuple(slice(0, s) for s in t.shape)] = t
        out[name] = batch
        out[name + "_shape"] = torch.tensor([list(t.shape) for t in present], dtype=torch.int64)


class Text(_Field):
    """UTF-8 text (checked natively): a list of str."""
    kind = "text"

    def __init__(self, key="txt", optional=False):
        super().__init__(key, optional)


class Json(_Field):
    """JSON (checked natively that it parses, naming the sample if not): a
    list of Python objects (``json.loads`` of the checked text, with the GIL)."""
    kind = "json"

    def __init__(self, key="json", optional=False):
        super().__init__(key, optional)

    def _sample(self, value):
        return None if value is None else json.loads(value)

    def _assemble(self, values, torch, name, out):
        out[name] = [self._sample(v) for v in values]


class Bytes(_Field):
    """The field's bytes as stored, for what you decode yourself (audio,
    video, protobuf): a list of bytes."""
    kind = "bytes"

    def __init__(self, key, optional=False):
        super().__init__(key, optional)


class Custom(_Field):
    """A field decoded by your own C function, compiled into a shared library
    that ``stoker.load_field_extension(path)`` loaded (stoker/field_extension.h;
    examples/field_extension/). It runs on the loader's threads without the
    GIL. Per sample a tensor (stacked when the batch's share one shape and
    dtype, else a list) or bytes, as the decoder hands over."""
    kind = "custom"

    def __init__(self, key, decoder, optional=False):
        super().__init__(key, optional)
        if not isinstance(decoder, str) or not decoder:
            raise TypeError("Custom(decoder=...) is the name a loaded extension registered, not %r" % (decoder,))
        self.decoder = decoder

    def _spec(self, name):
        spec = super()._spec(name)
        spec.decoder = self.decoder
        return spec

    def _sample(self, value):
        return value if value is None or isinstance(value, bytes) else _tensor(value)

    def _assemble(self, values, torch, name, out):
        items = [self._sample(v) for v in values]
        tensors = [t for t in items if t is not None and not isinstance(t, bytes)]
        if len(tensors) == len(items) and tensors and len({(tuple(t.shape), t.dtype) for t in tensors}) == 1:
            out[name] = torch.stack(tensors)
        else:
            out[name] = items


def _follows(follows):
    if follows in (None, False):
        return False
    if follows in ("image", True):
        return True
    raise ValueError("follows is \"image\" (the transformed image) or None, not %r" % (follows,))


class _Target(_Field):
    """Boxes and keypoints: per sample a float32 tensor; a list per batch,
    or with ``pad=value`` one tensor padded to the batch's largest count and
    ``<name>_count`` (int64 [B])."""

    def __init__(self, keys, follows, pad, optional):
        super().__init__(keys, optional)
        self.follows = _follows(follows)
        if pad is not None and not isinstance(pad, (int, float)):
            raise TypeError("pad is a number or None, not %r" % (pad,))
        self.pad = pad

    def _spec(self, name):
        spec = super()._spec(name)
        spec.follows = self.follows
        return spec

    _sample = Image._sample

    def _assemble(self, values, torch, name, out):
        tensors = [self._sample(v) for v in values]
        if self.pad is None or any(t is None for t in tensors) or not tensors:
            out[name] = tensors
            return
        counts = [t.shape[0] for t in tensors]
        batch = torch.full([len(tensors), max(counts)] + list(tensors[0].shape[1:]), self.pad, dtype=torch.float32)
        for i, t in enumerate(tensors):
            batch[i, :counts[i]] = t
        out[name] = batch
        out[name + "_count"] = torch.tensor(counts, dtype=torch.int64)


class Boxes(_Target):
    """Boxes (N x 4) from a ``.npy`` or a JSON list of lists, in ``format``
    "xyxy", "xywh" or "cxcywh" (kept on output). With ``follows="image"``
    they move with the transformed image, as torchvision.transforms.v2 moves
    BoundingBoxes: a moved box encloses its four moved corners, is clamped
    to the image after every step, and is dropped when left without area,
    together with its entry in ``labels`` (the name of an Array field, one
    label per box)."""
    kind = "boxes"

    def __init__(self, key="boxes.npy;boxes.json", format="xyxy", follows="image", labels=None, pad=None,
                 optional=False):
        super().__init__(key, follows, pad, optional)
        self.format = _params.choice("format", format, ("xyxy", "xywh", "cxcywh"))
        if labels is not None and (not isinstance(labels, str) or not labels):
            raise TypeError("labels names an Array field of the loader, not %r" % (labels,))
        self.labels = labels

    def _spec(self, name):
        spec = super()._spec(name)
        spec.box_format = self.format
        spec.labels = self.labels or ""
        return spec


class Keypoints(_Target):
    """Keypoints from a ``.npy`` or JSON: N x 2, N x K x 2 or N x K x 3 (the
    third value, a visibility, does not move). With ``follows="image"`` they
    move with the transformed image and may leave it (compare with its
    size)."""
    kind = "keypoints"

    def __init__(self, key="keypoints.npy;keypoints.json", follows="image", pad=None, optional=False):
        super().__init__(key, follows, pad, optional)


_MASK_MODES = {"L": 255, "I;16": 65535, "RGB": 255}  # and the largest fill each holds


class Mask(_Field):
    """A label map (PNG or another image), the size of its image, decoded
    in ``mode``: "L" (8-bit labels; colour images as their luma), "I;16"
    (16-bit labels such as Cityscapes' instance ids; int32, as torch 1.13
    has no uint16) or "RGB" (labels coded as colours, such as COCO
    panoptic's; [H, W, 3]). With ``follows="image"`` it takes every crop,
    flip, rotation, affine and resize the transformed image takes, with
    nearest-neighbour sampling (torchvision.transforms.v2's masks); pixels
    moved in from outside take ``fill``. Following masks come as one
    tensor [B, H, W] ([B, H, W, 3] for "RGB"); others as a list."""
    kind = "mask"

    def __init__(self, key="seg.png;mask.png", follows="image", fill=0, optional=False, mode="L"):
        super().__init__(key, optional)
        self.follows = _follows(follows)
        self.mode = _params.choice("mode", mode, tuple(_MASK_MODES))
        self.fill = _params.integer("fill", fill, 0, _MASK_MODES[self.mode])

    def _spec(self, name):
        spec = super()._spec(name)
        spec.follows = self.follows
        spec.fill = self.fill
        spec.mask_mode = self.mode
        return spec

    _sample = Image._sample

    def _assemble(self, values, torch, name, out):
        if isinstance(values, tuple):  # stacked natively: every sample present, of one shape
            out[name] = _tensor(values)
            return
        tensors = [self._sample(v) for v in values]
        if tensors and all(t is not None for t in tensors) and len({tuple(t.shape) for t in tensors}) == 1:
            out[name] = torch.stack(tensors)
        else:
            out[name] = tensors


def load_field_extension(path):
    """Loads a shared library of field decoders (stoker/field_extension.h)
    for ``stoker.Custom(key, decoder=name)``; returns the names loaded so far.
    Loading a path again does nothing."""
    import os
    _native.load_field_extension(os.fspath(path))
    return list(_native.field_extension_decoders())


def native_specs(fields):
    """(specs, transformed name or None, its transform) for LoaderOptions."""
    if not isinstance(fields, dict) or not fields:
        raise TypeError("fields is a non-empty dict of name -> stoker.Image/Int/Float/Array/Text/Json/Bytes/Boxes/"
                        "Keypoints/Mask")
    specs, transformed, transform = [], None, None
    for name, field in fields.items():
        if not isinstance(name, str) or not name:
            raise TypeError("field names are non-empty strings, not %r" % (name,))
        if not isinstance(field, _Field):
            raise TypeError("fields[%r] must be a stoker.Image, Int, Float, Array, Text, Json, Bytes, Boxes, "
                            "Keypoints, Mask or Custom, not %r" % (name, field))
        if isinstance(field, Image) and field.transform is not None:
            if transformed is not None:
                raise ValueError("only one Image may have a transform (%r and %r do)" % (transformed, name))
            transformed, transform = name, field.transform
        specs.append(field._spec(name))
    return specs, transformed, transform


def assemble(fields, transformed, images, raw):
    """The batch dict: the transformed image's tensor, then each other field
    put together by its spec."""
    import torch
    out = {}
    if transformed is not None:
        out[transformed] = images
    others = [(n, f) for n, f in fields.items() if n != transformed]
    for (name, field), values in zip(others, raw):
        field._assemble(values, torch, name, out)
    return out


def samples(fields, transformed, images, raw):
    """The batch as a list of per-sample dicts (for map= and collate=): the
    transformed image's row, and each other field's value for that sample
    (tensors at their own shapes, ints, floats, str, objects, bytes, None)."""
    others = [(n, f) for n, f in fields.items() if n != transformed]
    # A column stacked natively (a tuple, see Array) gives each sample its row.
    columns = [_tensor(values) if isinstance(values, tuple) else values for values in raw]
    count = len(columns[0]) if columns else (len(images) if images is not None else 0)
    out = []
    for j in range(count):
        sample = {} if transformed is None else {transformed: images[j]}
        for (name, field), values in zip(others, columns):
            sample[name] = values[j] if not isinstance(values, list) else field._sample(values[j])
        out.append(sample)
    return out


def check_hooks(map_fn, collate_fn):
    for name, fn in (("map", map_fn), ("collate", collate_fn)):
        if fn is not None and not callable(fn):
            raise TypeError("%s= takes a callable, not %r" % (name, fn))


def default_collate(batch):
    """collate= when only map= is given: torch's default_collate."""
    from torch.utils.data import default_collate as collate
    return collate(batch)
