"""A DDP loop with a loss scaler, for tests/python/test_elastic_trainer.py:
stoker.elastic.Trainer(..., scaler=...) must carry the scaler's state to a
worker that joins, so the scale goes on as in an uninterrupted run.

torch 1.13's GradScaler needs CUDA, so the scaler here is a stand-in with
GradScaler's protocol (scale, step that skips on overflow, update,
state_dict/load_state_dict); steps 3 and 8 "overflow" (the scaler skips
the optimizer's step and halves the scale), and the scale doubles after
every 2 good steps. The GPU check runs examples/elastic_ddp.py --amp with
the real GradScaler.

    python elastic_scaler_job.py --data DATA --log LOG [--step-delay S] [--pause-while PATH]

Every rank appends {"step", "rank", "world_size", "stepped", "scale",
"growth"} per committed step to LOG.
"""
import argparse
import json
import os
import sys
import time

OVERFLOW_AT = (3, 8)


class ScalerLike:
    def __init__(self):
        self.scale_value, self.growth, self._skipped = 1024.0, 0, False

    def scale(self, loss):
        return loss * self.scale_value

    def step(self, optimizer, overflow):
        if overflow:
            self._skipped = True
            return None
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad /= self.scale_value
        return optimizer.step()

    def update(self):
        if self._skipped:
            self.scale_value, self.growth = self.scale_value / 2, 0
        else:
            self.growth += 1
            if self.growth == 2:
                self.scale_value, self.growth = self.scale_value * 2, 0
        self._skipped = False

    def state_dict(self):
        return {"scale": self.scale_value, "growth_tracker": self.growth}

    def load_state_dict(self, state):
        self.scale_value, self.growth = state["scale"], state["growth_tracker"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--pause-while", metavar="PATH", help="before each step, wait while PATH exists")
    args = p.parse_args()
    import stoker
    import stoker.elastic
    import stoker.transforms as T
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ScalerLike()
    loader = stoker.Loader(args.data, global_batch_size=16, with_indices=True, num_threads=1, log_epochs=False,
                           transform=T.Compose([T.Resize(8), T.CenterCrop(8)]))

    def log_step(info):
        line = json.dumps({"step": info["step"], "rank": info["rank"], "world_size": info["world_size"],
                           "stepped": info["stepped"], "scale": scaler.scale_value, "growth": scaler.growth}) + "\n"
        fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    trainer = stoker.elastic.Trainer(model, optimizer, loader, epochs=2, scaler=scaler, on_commit=log_step,
                                     timeout=5)
    for images, labels, _ in trainer:
        while args.pause_while and os.path.exists(args.pause_while):
            time.sleep(0.05)
        with trainer.step():
            loss = torch.nn.functional.cross_entropy(trainer.model(images), labels % 4)
            scaler.scale(loss * trainer.loss_weight(len(labels))).backward()
            if args.step_delay:
                time.sleep(args.step_delay)
            scaler.step(optimizer, overflow=trainer.global_step + 1 in OVERFLOW_AT)
            scaler.update()
            optimizer.zero_grad()
    return 0


if __name__ == "__main__":
    sys.exit(main())
