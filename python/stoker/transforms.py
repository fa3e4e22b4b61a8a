"""Transforms written as in torchvision, compiled into stoker's fused native
pipeline (crop box, bilinear resize of just that box, flip, normalise and
dtype conversion in one pass). Supported shapes:

    Compose([RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(p)?, Normalize(mean, std)?])
    Compose([Resize(size), CenterCrop(size), Normalize(mean, std)?])

``ToTensor()`` may appear anywhere and does nothing (outputs are tensors).
Without ``Normalize``, float outputs are ``v / 255`` as after ToTensor.
"""
import math

from . import _native

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(size):
    if isinstance(size, int):
        return size, size
    size = tuple(size)
    if len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError("size must be an int or (height, width), not %r" % (size,))
    return size


class RandomResizedCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
        self.size = _pair(size)
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError("p must be in [0, 1], not %r" % (p,))
        self.p = p


class Resize:
    def __init__(self, size):
        if not isinstance(size, int):
            raise ValueError("only Resize(int) (the shorter side) is supported, not %r" % (size,))
        self.size = size


class CenterCrop:
    def __init__(self, size):
        self.size = _pair(size)


class Normalize:
    def __init__(self, mean, std):
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean and std need three values (RGB)")
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if not all(math.isfinite(m) for m in mean):
            raise ValueError("mean values must be finite numbers, not %r" % (mean,))
        if not all(math.isfinite(s) and s > 0 for s in std):
            raise ValueError("std values must be positive finite numbers, not %r" % (std,))
        self.mean = mean
        self.std = std


class ToTensor:
    """Accepted for familiarity; stoker always outputs tensors."""


class Compose:
    """``dct_scaling=True`` lets the decoder shrink by 2, 4 or 8 in the DCT
    domain when the crop is at least that many times the output: much faster,
    slightly different pixels from full-resolution decoding."""

    def __init__(self, transforms, dct_scaling=True):
        self.transforms = [t for t in transforms if not isinstance(t, ToTensor)]
        self.dct_scaling = bool(dct_scaling)
        self._options()  # validate now, not at the first batch

    def _options(self):
        ts = list(self.transforms)
        o = _native.TransformOptions()
        o.dct_scaling = self.dct_scaling
        o.normalize = False
        o.flip_probability = 0.0
        if not ts:
            raise ValueError("Compose needs RandomResizedCrop, or Resize followed by CenterCrop")
        first = ts.pop(0)
        if isinstance(first, RandomResizedCrop):
            o.kind = _native.TransformKind.random_resized_crop
            o.height, o.width = first.size
            o.scale = list(first.scale)
            o.ratio = list(first.ratio)
            if ts and isinstance(ts[0], RandomHorizontalFlip):
                o.flip_probability = ts.pop(0).p
        elif isinstance(first, Resize):
            if not ts or not isinstance(ts[0], CenterCrop):
                raise ValueError("Resize must be followed by CenterCrop")
            crop = ts.pop(0)
            o.kind = _native.TransformKind.resize_center_crop
            o.resize = first.size
            o.height, o.width = crop.size
            if ts and isinstance(ts[0], RandomHorizontalFlip):
                o.flip_probability = ts.pop(0).p
        else:
            raise ValueError("Compose must start with RandomResizedCrop or Resize, not %s" % type(first).__name__)
        if ts and isinstance(ts[0], Normalize):
            n = ts.pop(0)
            o.normalize = True
            o.mean = list(n.mean)
            o.std = list(n.std)
        if ts:
            raise ValueError("unsupported transform sequence: %s cannot follow here"
                             % ", ".join(type(t).__name__ for t in ts))
        return o


def apply(jpeg, transform, dtype="float32", layout=None, seed=0, epoch=0, sample=0):
    """Decodes and transforms one JPEG (bytes) exactly as a Loader with this
    seed does to dataset sample ``sample`` in epoch ``epoch``. Returns
    ``(tensor, trace)``; trace holds the source box, flip and decode scale."""
    import torch
    from . import _DTYPES, _dtype_name
    name = _dtype_name(dtype)
    o = transform._options()
    o.dtype = _DTYPES[name]
    layout = layout or ("NHWC" if name == "uint8" else "NCHW")
    o.layout = getattr(_native.Layout, layout)
    data, trace = _native.transform_image(bytes(jpeg), o, int(seed), int(epoch), int(sample))
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                   "uint8": torch.uint8}[name]
    shape = (3, o.height, o.width) if layout == "NCHW" else (o.height, o.width, 3)
    tensor = torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)
    return tensor, trace
