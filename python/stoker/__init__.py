"""stoker: keep deep-learning GPUs busy.

``stoker.Loader`` replaces a torch DataLoader over a packed dataset: native
threads read, decode (libjpeg-turbo, region of interest, DCT scaling),
augment with torchvision's semantics and normalise straight into reusable
batch buffers, which reach torch as zero-copy tensors.

    import stoker, stoker.transforms as T
    loader = stoker.Loader("imagenet-packed", batch_size=256, shuffle=True, seed=0,
                           transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                T.Normalize(mean, std)]))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...
"""
from . import _native
from . import transforms

__all__ = ["Loader", "TokenLoader", "write_tokens", "tokenize", "pack", "merge", "DatasetWriter", "cuda_status", "StokerError", "CorruptionError", "transforms", "Checkpointer", "Checkpoint", "Shard", "export_safetensors",
           "load_checkpoint", "load_latest", "load_safetensors", "list_checkpoints", "restore_rng", "order_quality",
           "decode_image", "decode_npy", "decode_array", "band_stats", "Image", "Int", "Float", "Array", "Text", "Json", "Bytes", "Boxes", "Keypoints", "Mask",
           "Custom", "load_field_extension"]


class StokerError(RuntimeError):
    """An error inside stoker that has no more specific Python type."""


class CorruptionError(StokerError, ValueError):
    """Bytes on storage are not what the format says (names the sample and shard:offset)."""


_native._set_exceptions(StokerError, CorruptionError)

from .checkpoint import (Checkpoint, Checkpointer, Shard, export_safetensors, list_checkpoints,  # noqa: E402
                         load_checkpoint, load_latest,
                         load_safetensors, parse_size, restore_rng)
from .order_quality import order_quality  # noqa: E402
from .decode import decode_array, decode_image, decode_npy  # noqa: E402
from .band_stats import band_stats  # noqa: E402
from .fields import Array, Boxes, Bytes, Custom, Float, Image, Int, Json, Keypoints, Mask, Text, load_field_extension  # noqa: E402,E501
from ._pack import merge, pack  # noqa: E402
from ._writer import DatasetWriter  # noqa: E402
from .tokens import TokenLoader, write_tokens  # noqa: E402
from .tokenize import tokenize  # noqa: E402
from ._loader import Loader  # noqa: E402

Loader.__module__ = __name__  # stoker.Loader, as users name it


def cuda_status():
    """Whether stoker can use CUDA here: {"built_with_cuda", "device_count",
    "reason"} (why not, when device_count is 0). stoker never needs CUDA
    libraries to import: the runtime is linked statically and used only when
    a device is present."""
    return dict(_native.cuda_status())
