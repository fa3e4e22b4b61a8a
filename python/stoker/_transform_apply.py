"""stoker.transforms.apply: one image through a Compose, or through one
step, exactly as a Loader transforms a dataset's sample (for tests and for
comparing against torchvision), with the parameters drawn or replayed."""
from . import _native


def _pixels(image):
    """(bytes, width, height) of an RGB image given as a PIL image, or a
    uint8 array or tensor of shape [H, W, 3]."""
    import numpy as np
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL
        image = np.asarray(image.convert("RGB"))
    array = np.ascontiguousarray(np.asarray(image))
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError("pixels must be uint8 of shape [H, W, 3], not %s %s" % (array.dtype, array.shape))
    return array.tobytes(), array.shape[1], array.shape[0]


def apply(image, transform, dtype="float32", layout=None, seed=0, epoch=0, sample=0, params=None):
    """Transforms one image exactly as a Loader with this seed does to
    dataset sample ``sample`` in epoch ``epoch``.

    ``image``: encoded bytes (JPEG, PNG, WebP), a PIL image, or uint8
    pixels [H, W, 3]. ``transform``: a Compose (returns the output tensor,
    as in a batch) or one step such as RandomRotation(30) (returns uint8
    pixels [H, W, 3] at the step's output size; pixels or PIL input only).
    ``params``: what to use instead of drawing it: a trace this function
    returned (its crop box, flip and steps), or the list ``trace["steps"]``
    (the steps only). Returns ``(tensor, trace)``; trace holds the source
    box, flip, decode scale and every step's parameters."""
    import torch
    from . import _params
    from .transforms import Compose, _Step
    box = flip = None
    if isinstance(params, dict):
        box = tuple(float(v) for v in params["box"]) if "box" in params else None
        flip = bool(params["flipped"]) if "flipped" in params else None
        params = params.get("steps")
    replay = None if params is None else list(params)
    if isinstance(transform, _Step):
        if isinstance(image, (bytes, bytearray, memoryview)):
            raise ValueError("apply one step to pixels (a PIL image or a uint8 array); encoded bytes go through "
                             "a Compose")
        data, width, height = _pixels(image)
        out, w, h, steps = _native.augment_image(data, width, height, [transform._step()], int(seed), int(epoch),
                                                 int(sample), replay)
        tensor = torch.frombuffer(bytearray(out), dtype=torch.uint8).reshape(h, w, 3)
        return tensor, {"steps": steps, "source_size": (width, height)}
    if not isinstance(transform, Compose):
        raise TypeError("transform must be a stoker.transforms.Compose or one step, not %s" % type(transform).__name__)
    name, native_dtype = _params.output_dtype(dtype)
    o = transform._options()
    o.dtype = native_dtype
    layout = layout or ("NHWC" if name == "uint8" else "NCHW")
    o.layout = getattr(_native.Layout, layout)
    if isinstance(image, (bytes, bytearray, memoryview)):
        data, trace = _native.transform_image(bytes(image), o, int(seed), int(epoch), int(sample), replay=replay,
                                              box=box, flip=flip)
    else:
        pixels, width, height = _pixels(image)
        data, trace = _native.transform_image(None, o, int(seed), int(epoch), int(sample), pixels=pixels,
                                              width=width, height=height, replay=replay, box=box, flip=flip)
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                   "uint8": torch.uint8}[name]
    shape = (3, o.height, o.width) if layout == "NCHW" else (o.height, o.width, 3)
    tensor = torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)
    return tensor, trace
