"""Batch-level MixUp and CutMix with torchvision.transforms.v2's semantics:

    mixup = stoker.transforms.MixUp(alpha=1.0, num_classes=1000)
    images, soft_labels = mixup(images, labels)      # any finished batch, CPU or GPU

or ``stoker.Loader(..., batch_transform=mixup)``. Each batch is mixed with
itself rolled by one (sample i with sample i - 1), with a weight drawn from
Beta(alpha, alpha); labels become one-hot rows mixed with the same weight
(each row sums to 1). The work runs on the batch's device; the batch the
loader handed out is not modified. Draws come from a generator seeded by
``seed``, so a run repeats; ``last`` holds the last batch's parameters.
"""
import math

import numpy as np


class _Mix:
    def __init__(self, alpha, num_classes, seed, layout):
        alpha = float(alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError("alpha must be a positive number, not %r" % (alpha,))
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError("num_classes must be a positive integer, not %r" % (num_classes,))
        if layout not in ("NCHW", "NHWC"):
            raise ValueError("layout must be NCHW or NHWC, not %r" % (layout,))
        self.alpha, self.num_classes, self.layout = alpha, num_classes, layout
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self.last = None

    def _check(self, images, labels):
        import torch
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            raise ValueError("images must be a batch tensor of 4 dimensions (%s), not %s"
                             % (self.layout, getattr(images, "shape", type(images).__name__)))
        if not isinstance(labels, torch.Tensor) or labels.ndim != 1 or labels.shape[0] != images.shape[0] or \
                labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError("labels must be integer class indices of shape (%d,), not %s %s"
                             % (images.shape[0], getattr(labels, "dtype", ""), tuple(getattr(labels, "shape", ()))))
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError("labels must be in [0, %d) (num_classes), found %d..%d"
                             % (self.num_classes, int(labels.min()), int(labels.max())))

    def _mix_labels(self, labels, lam, dtype):
        import torch
        one_hot = torch.nn.functional.one_hot(labels.long(), self.num_classes).to(dtype)
        return one_hot.roll(1, 0).mul_(1.0 - lam).add_(one_hot.mul(lam))

    def __repr__(self):
        return "%s(alpha=%r, num_classes=%r)" % (type(self).__name__, self.alpha, self.num_classes)


class MixUp(_Mix):
    """images * lam + images.roll(1, 0) * (1 - lam); floating images only."""

    def __init__(self, alpha=1.0, num_classes=None, seed=0, layout="NCHW"):
        super().__init__(alpha, num_classes, seed, layout)

    def __call__(self, images, labels):
        self._check(images, labels)
        if not images.is_floating_point():
            raise ValueError("MixUp needs floating-point images (a weighted sum), not %s" % images.dtype)
        lam = float(self._rng.beta(self.alpha, self.alpha))
        self.last = {"lam": lam}
        mixed = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        return mixed, self._mix_labels(labels, lam, images.dtype)


class CutMix(_Mix):
    """A box of each image replaced by the same box of the previous one;
    labels weighted by the area kept."""

    def __init__(self, alpha=1.0, num_classes=None, seed=0, layout="NCHW"):
        super().__init__(alpha, num_classes, seed, layout)

    def __call__(self, images, labels):
        self._check(images, labels)
        lam = float(self._rng.beta(self.alpha, self.alpha))
        h, w = (images.shape[-2], images.shape[-1]) if self.layout == "NCHW" else (images.shape[1], images.shape[2])
        r_x, r_y = int(self._rng.integers(w)), int(self._rng.integers(h))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * w), int(r * h)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (w * h)
        self.last = {"lam": lam, "box": (x1, y1, x2, y2)}
        out = images.clone()
        rolled = images.roll(1, 0)
        if self.layout == "NCHW":
            out[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
        else:
            out[:, y1:y2, x1:x2, :] = rolled[:, y1:y2, x1:x2, :]
        dtype = images.dtype if images.is_floating_point() else __import__("torch").float32
        return out, self._mix_labels(labels, lam, dtype)
