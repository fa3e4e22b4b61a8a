"""Batches to a CUDA device (fields= and TokenLoader batches): see DeviceMover."""


class DeviceMover:
    """Moves a batch's tensors to a CUDA device as DataLoader(pin_memory=True)
    and a prefetching loop would: each through pinned memory (torch's caching
    host allocator, which keeps a block until its copy is done), copied on a
    stream of its own that torch's current stream then waits on (no host
    synchronisation), each result recorded on the current stream for the
    caching allocator. Values that are not tensors stay as they are: lists
    (images and arrays at their own sizes, text, JSON objects, bytes) stay on
    the host. A dict's or a tuple's top-level tensors move (a collate=
    result's too)."""

    def __init__(self, torch, device):
        self._torch = torch
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device)

    def __call__(self, batch):
        torch = self._torch
        current = torch.cuda.current_stream(self.device)
        moved = []

        def move(value):
            if not torch.is_tensor(value):
                return value
            with torch.cuda.stream(self._stream):
                out = value.pin_memory().to(self.device, non_blocking=True)
            moved.append(out)
            return out
        if isinstance(batch, dict):
            out = {k: move(v) for k, v in batch.items()}
        elif isinstance(batch, tuple):
            out = type(batch)(*(move(v) for v in batch)) if hasattr(batch, "_fields") else tuple(
                move(v) for v in batch)
        else:
            out = move(batch)
        if moved:
            current.wait_stream(self._stream)
            for tensor in moved:
                tensor.record_stream(current)
        return out
