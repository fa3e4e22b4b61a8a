"""Transforms written as in torchvision, compiled into stoker's native
pipeline. A Compose is read in stages:

    [steps before the crop]  the whole decoded image (RandomRotation, ColorJitter, ...)
    crop stage               RandomResizedCrop, or Resize(int) + CenterCrop, with an optional
                             RandomHorizontalFlip fused into the final write
    [steps after the crop]   on the output-sized image; they must keep its size
    Normalize                optional (without it float outputs are v / 255, as after ToTensor)
    [steps after Normalize]  on the output tensor: RandomErasing

Without a crop stage, the steps must end at a fixed size (RandomCrop,
CenterCrop or Resize((h, w))), as CIFAR's RandomCrop(32, padding=4) does.
Each step matches torchvision's functional op on a PIL image
(stoker.transforms.apply reports or replays the parameters drawn).
``ToTensor()`` may appear anywhere and does nothing (outputs are tensors).
"""
import math
import numbers

from . import _native
from . import mix as _mix
from ._pillow import resize_like_pillow  # noqa: F401 - stoker.transforms.resize_like_pillow
from ._transform_apply import apply  # noqa: F401 - stoker.transforms.apply

MixUp, CutMix = _mix.MixUp, _mix.CutMix  # batch-level, as torchvision.transforms.v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(size):
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    size = tuple(size)
    if len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError("size must be an int or (height, width), not %r" % (size,))
    return size


def _numbers(value):
    if isinstance(value, bool):
        return [1.0 if value else 0.0]
    if isinstance(value, numbers.Number):
        return [float(value)]
    return [float(v) for v in value]


def _interpolation(mode):
    # torchvision's InterpolationMode, or its value as a string.
    return str(getattr(mode, "value", mode)).lower()


class _Step:
    """A step stoker compiles: ``_name``, numeric ``_args`` and ``_words``."""

    def _children(self):
        return []

    def _step(self):
        args = [(k, _numbers(v)) for k, v in self._args.items() if v is not None]
        words = [(k, str(v)) for k, v in getattr(self, "_words", {}).items() if v is not None]
        return _native.TransformStep(self._name, args, words, [c._step() for c in self._children()])

    def _check(self):
        _native.check_step(self._step())  # refuse bad arguments now, as torchvision does

    def _size(self, size):
        """The (height, width) this step makes of ``size`` (None: unknown)."""
        return size

    def __repr__(self):
        return "%s(%s)" % (self._name, ", ".join("%s=%r" % kv for kv in self._args.items() if kv[1] is not None))


def _resize_interpolation(mode, where):
    """The crop stage's resize: Pillow's bilinear or bicubic, as torchvision asks it of PIL."""
    word = _interpolation(mode)
    if word not in ("bilinear", "bicubic"):
        raise ValueError("%s: interpolation %r is not supported (bilinear or bicubic)" % (where, word))
    return word


class RandomResizedCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear",
                 antialias=None):
        self.size = _pair(size)
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)
        self.interpolation = _resize_interpolation(interpolation, "RandomResizedCrop")


class RandomHorizontalFlip(_Step):
    _name = "RandomHorizontalFlip"

    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError("p must be in [0, 1], not %r" % (p,))
        self.p = p
        self._args = {"p": p}


class RandomVerticalFlip(_Step):
    _name = "RandomVerticalFlip"

    def __init__(self, p=0.5):
        self._args = {"p": p}
        self._check()


class Resize(_Step):
    """Resize(int): the shorter side (before CenterCrop: the fused eval
    transform); Resize((h, w)): that size. Bilinear, as Pillow resizes.
    In an Array's transform also ``interpolation="nearest"`` (label maps),
    and bilinear there is torchvision's antialiased tensor resize."""
    _name = "Resize"

    def __init__(self, size, interpolation="bilinear"):
        if isinstance(size, numbers.Number) or len(tuple(size)) == 1:
            self.size = int(size) if isinstance(size, numbers.Number) else int(tuple(size)[0])
        else:
            self.size = tuple(int(s) for s in size)
        self._args = {"size": self.size}
        self._words = {"interpolation": _interpolation(interpolation)}
        if self._words["interpolation"] != "nearest":  # nearest is for arrays: an image's Compose refuses it
            self._check()
        elif any(isinstance(s, bool) or s < 1 for s in (self.size if isinstance(self.size, tuple) else (self.size,))) \
                or isinstance(self.size, tuple) and len(self.size) != 2:
            raise ValueError("Resize: size must be one or two positive integers, not %r" % (size,))

    def _size(self, size):
        return self.size if isinstance(self.size, tuple) else None


class CenterCrop(_Step):
    _name = "CenterCrop"

    def __init__(self, size):
        self.size = _pair(size)
        self._args = {"size": self.size}

    def _size(self, size):
        return tuple(self.size)


class Pad(_Step):
    _name = "Pad"

    def __init__(self, padding, fill=0, padding_mode="constant"):
        self._args = {"padding": padding, "fill": fill}
        self._words = {"padding_mode": padding_mode}
        self._check()
        p = _numbers(padding)
        self._pad = {1: p * 4, 2: p * 2}.get(len(p), p)  # left, top, right, bottom

    def _size(self, size):
        l, t, r, b = self._pad
        return None if size is None else (size[0] + int(t + b), size[1] + int(l + r))


class RandomCrop(_Step):
    _name = "RandomCrop"

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = _pair(size)
        self._args = {"size": self.size, "padding": padding, "pad_if_needed": bool(pad_if_needed), "fill": fill}
        self._words = {"padding_mode": padding_mode}
        self._check()

    def _size(self, size):
        return tuple(self.size)


class RandomRotation(_Step):
    _name = "RandomRotation"

    def __init__(self, degrees, interpolation="nearest", expand=False, center=None, fill=0):
        self.expand = bool(expand)
        self._args = {"degrees": degrees, "expand": self.expand, "center": center, "fill": fill}
        self._words = {"interpolation": _interpolation(interpolation)}
        self._check()

    def _size(self, size):
        return None if self.expand else size


class RandomAffine(_Step):
    _name = "RandomAffine"

    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest", fill=0,
                 center=None):
        self._args = {"degrees": degrees, "translate": translate, "scale": scale, "shear": shear, "fill": fill,
                      "center": center}
        self._words = {"interpolation": _interpolation(interpolation)}
        self._check()


class ColorJitter(_Step):
    _name = "ColorJitter"

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        self._args = {"brightness": brightness, "contrast": contrast, "saturation": saturation, "hue": hue}
        self._check()


class Grayscale(_Step):
    """Grayscale(num_output_channels=3): batches hold three channels."""
    _name = "Grayscale"

    def __init__(self, num_output_channels=1):
        self._args = {"num_output_channels": num_output_channels}
        self._check()


class RandomGrayscale(_Step):
    _name = "RandomGrayscale"

    def __init__(self, p=0.1):
        self._args = {"p": p}
        self._check()


class GaussianBlur(_Step):
    _name = "GaussianBlur"

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        self._args = {"kernel_size": kernel_size, "sigma": sigma}
        self._check()


class RandomErasing(_Step):
    """On the normalised tensor: put it after Normalize, as in torchvision."""
    _name = "RandomErasing"

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False):
        random = isinstance(value, str)
        self._args = {"p": p, "scale": scale, "ratio": ratio, "value": None if random else value}
        self._words = {"value": value if random else None}
        self._check()


def _fill_arg(fill):
    return 0 if fill is None else fill


class RandAugment(_Step):
    """torchvision's RandAugment. trace parameters: op0, magnitude0, ... (op
    indexes AUGMENT_OPS; the magnitude is signed)."""
    _name = "RandAugment"

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self._args = {"num_ops": num_ops, "magnitude": magnitude, "num_magnitude_bins": num_magnitude_bins,
                      "fill": _fill_arg(fill)}
        self._words = {"interpolation": _interpolation(interpolation)}
        self._check()


class TrivialAugmentWide(_Step):
    _name = "TrivialAugmentWide"

    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        self._args = {"num_magnitude_bins": num_magnitude_bins, "fill": _fill_arg(fill)}
        self._words = {"interpolation": _interpolation(interpolation)}
        self._check()


class AutoAugment(_Step):
    """policy: "imagenet" (default), "cifar10", "svhn" or torchvision's AutoAugmentPolicy."""
    _name = "AutoAugment"

    def __init__(self, policy="imagenet", interpolation="nearest", fill=None):
        self._args = {"fill": _fill_arg(fill)}
        self._words = {"policy": str(getattr(policy, "value", policy)).lower(),
                       "interpolation": _interpolation(interpolation)}
        self._check()


# What the op indexes of RandAugment, TrivialAugmentWide and AutoAugment name.
AUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
               "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")


class RandomApply(_Step):
    _name = "RandomApply"

    def __init__(self, transforms, p=0.5):
        self.transforms = list(transforms)
        self._args = {"p": p}
        self._check()

    def _children(self):
        return _as_steps(self.transforms, "RandomApply")

    def _size(self, size):
        out = _fold(self.transforms, size)
        return size if out == size else None


class RandomChoice(_Step):
    _name = "RandomChoice"

    def __init__(self, transforms, p=None):
        self.transforms = list(transforms)
        self._args = {"p": p}
        self._check()

    def _children(self):
        return _as_steps(self.transforms, "RandomChoice")

    def _size(self, size):
        sizes = {_fold([t], size) for t in self.transforms}
        return sizes.pop() if len(sizes) == 1 else None


def _as_steps(transforms, where):
    for t in transforms:
        if not isinstance(t, _Step):
            raise ValueError("%s cannot hold %s" % (where, type(t).__name__))
    return transforms


def _fold(steps, size):
    for s in steps:
        size = s._size(size)
    return size


class Normalize:
    """(x - mean) / std a channel: three values for images (RGB); for an
    Array's bands one value, or one a band (to float32)."""

    def __init__(self, mean, std):
        if len(mean) < 1 or len(std) < 1:
            raise ValueError("mean and std need values (three for RGB images, one a band for arrays)")
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

    def _crop_stage(self, ts):
        for i, t in enumerate(ts):
            if isinstance(t, RandomResizedCrop):
                return i, 1
            if isinstance(t, Resize) and isinstance(t.size, int) and i + 1 < len(ts) and \
                    isinstance(ts[i + 1], CenterCrop):
                return i, 2
        return None, 0

    def _options(self):
        ts = list(self.transforms)
        if not ts:
            raise ValueError("Compose needs at least one transform (RandomResizedCrop, Resize + CenterCrop, ...)")
        norms = [i for i, t in enumerate(ts) if isinstance(t, Normalize)]
        if len(norms) > 1:
            raise ValueError("Compose holds Normalize once")
        o = _native.TransformOptions()
        o.dct_scaling = self.dct_scaling
        o.normalize = False
        o.flip_probability = 0.0
        tail = []
        if norms:
            n = ts[norms[0]]
            if len(n.mean) != 3 or len(n.std) != 3:
                raise ValueError("an image's Normalize needs three means and three stds (RGB), not %d and %d "
                                 "(an Array's transform of bands is a list of steps, not a Compose)"
                                 % (len(n.mean), len(n.std)))
            o.normalize, o.mean, o.std = True, list(n.mean), list(n.std)
            ts, tail = ts[:norms[0]], ts[norms[0] + 1:]
        for t in ts + tail:
            if not isinstance(t, (_Step, RandomResizedCrop)):
                raise ValueError(_not_compiled(t))
        for t in tail:
            if not isinstance(t, RandomErasing):
                raise ValueError("%s cannot follow Normalize (only RandomErasing works on the normalised tensor)"
                                 % type(t).__name__)
        for t in ts:
            if isinstance(t, RandomErasing):
                raise ValueError("RandomErasing works on the normalised tensor: put it after Normalize")
        at, length = self._crop_stage(ts)
        if at is None:
            size = _fold(ts, None)
            if size is None:
                raise ValueError("without RandomResizedCrop or Resize + CenterCrop, the steps must end at a fixed "
                                 "size: end with RandomCrop, CenterCrop or Resize((h, w))")
            o.kind = _native.TransformKind.none
            o.height, o.width = size
            before, after = ts, []
        else:
            stage = ts[at]
            if length == 1:
                o.kind = _native.TransformKind.random_resized_crop
                o.height, o.width = stage.size
                o.scale = list(stage.scale)
                o.ratio = list(stage.ratio)
                o.interpolation = getattr(_native.ResizeInterpolation, stage.interpolation)
            else:
                o.kind = _native.TransformKind.resize_center_crop
                o.resize = stage.size
                o.height, o.width = ts[at + 1].size
                o.interpolation = getattr(_native.ResizeInterpolation,
                                          _resize_interpolation(stage._words["interpolation"], "Resize"))
            before, after = ts[:at], ts[at + length:]
            if after and isinstance(after[0], RandomHorizontalFlip):
                o.flip_probability = after.pop(0).p  # fused into the final write
            for t in before + after:
                if isinstance(t, RandomResizedCrop):
                    raise ValueError("Compose holds one RandomResizedCrop")
            for t in after:
                if t._size((o.height, o.width)) != (o.height, o.width):
                    raise ValueError("%s after the crop would change the %dx%d output size (put it before the "
                                     "crop)" % (type(t).__name__, o.width, o.height))
        o.before_crop = [t._step() for t in before]
        o.after_crop = [t._step() for t in after]
        o.after_normalize = [t._step() for t in tail]
        return o


def _not_compiled(t):
    """Why Compose cannot take ``t``: a torchvision transform stoker has
    under the same name is named as such (a Compose ported from torchvision)."""
    name, module = type(t).__name__, type(t).__module__ or ""
    if isinstance(globals().get(name), type) and not module.startswith("stoker"):
        return ("this %s is %s's; stoker's Compose takes stoker.transforms.%s (the same arguments, run natively)"
                % (name, module.split(".")[0] or "another library", name))
    return "stoker does not compile %s (see stoker.transforms for the steps it does)" % name
