"""The DDP job the recovery bench's peers train (bench/plain_ddp.py under
torchrun, bench/torchft_ddp.py under torchft), as examples/elastic_ddp.py
trains it under stoker: the same small CNN, SGD with momentum, StepLR,
images resized to 16 x 16, two micro-batches a step, one JSON line per
step appended to a log. Kept in one place so that the peers differ only
in what they are compared on: how they recover."""
import hashlib
import json
import os

STEP_SIZE, GAMMA = 3, 0.7  # StepLR, as examples/elastic_ddp.py


def make_job(lr):
    """(model, optimizer, scheduler), seeded alike on every process."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)


def image_folder(path):
    """torchvision's ImageFolder over the unpacked demo images, 16 x 16 tensors."""
    import torchvision
    import torchvision.transforms as T
    return torchvision.datasets.ImageFolder(path, T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))


def backward_in_two(ddp, dataset, samples):
    """The step's gradients from `samples` (dataset indices) in two
    micro-batches, the first without DDP's all-reduce."""
    import torch
    from torch import nn
    images = torch.stack([dataset[i][0] for i in samples])
    labels = torch.tensor([dataset[i][1] for i in samples])
    n, half = len(samples), (len(samples) + 1) // 2
    with ddp.no_sync():
        (nn.functional.cross_entropy(ddp(images[:half]), labels[:half] % 10) * half / n).backward()
    (nn.functional.cross_entropy(ddp(images[half:]), labels[half:] % 10) * (n - half) / n).backward()


def digest(model):
    h = hashlib.sha256()
    for q in model.parameters():
        h.update(q.detach().numpy().tobytes())
    return h.hexdigest()


def append_line(path, record):
    """One write: a killed writer leaves no torn line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
