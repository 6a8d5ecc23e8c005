"""The model, the data and the bookkeeping of notebook 08's exercise 4, a DDP program that the learner completes.
Used by notebook 08. Lives in utils/ because the program runs in worker processes that ``torchrun`` starts, which
import it; the check (:mod:`utils.exercises.nb08`) trains the same model in one process to compare.

The learner's exercise cell imports :class:`ToyModel` and :func:`make_dataset` and defines ``main(out)``. The
check writes that cell to ``notebooks/runs/ex4_ddp.py`` followed by::

    if __name__ == "__main__":
        from utils.ddp.exercise import run_and_record
        run_and_record(main)

and runs it with ``utils.launch.run_torchrun`` on 2 processes. :func:`run_and_record` calls ``main(out)`` and
then writes, for its rank, what the program did: the indices it read from the dataset (so, its shard of every
epoch), the indices a ``DistributedSampler`` gave out, how many ``DistributedDataParallel`` it built and forwards
it ran through one, what it saved with ``torch.save``, and whether it left its process group. Each process is
told that it is alone on its machine (``LOCAL_RANK`` 0, ``LOCAL_WORLD_SIZE`` 1, ``GROUP_RANK`` its rank), as in a
job of 2 machines with one process each, so that a program that picks its writer by ``LOCAL_RANK`` shows it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import Dataset

EPOCHS = 3
BATCH_SIZE = 8
"""Per rank."""
LR = 0.05
MOMENTUM = 0.9
SEED = 0
SAMPLES = 64
SAVED_NAME = "model.pt"
"""The file rank 0 writes into ``out``."""

_READ: list[int] = []
"""The indices this process read from a :class:`ToyData`, in order."""


class ToyModel(nn.Module):
    """PyTorch's DDP tutorial example, as in section 3: Linear(10, 10) -> ReLU -> Linear(10, 5)."""

    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def make_data(n: int = SAMPLES, seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """n inputs of size 10 and targets of size 5, the same in every process (section 3's ``make_data``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = torch.tanh(x @ (torch.randn(10, 5, generator=g) / 10**0.5)) + 0.1 * torch.randn(n, 5, generator=g)
    return x, y


class ToyData(Dataset):
    """The 64 samples of :func:`make_data` as a dataset; it notes every index this process reads."""

    def __init__(self):
        self.x, self.y = make_data()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        _READ.append(int(i))
        return self.x[i], self.y[i]


def make_dataset() -> ToyData:
    """The exercise's dataset: 64 samples, the same on every rank."""
    return ToyData()


def run_and_record(main) -> None:
    """Run ``main(out)`` in a worker started by torchrun (``--out DIR --record DIR``), and write what it did to
    ``record/rank<RANK>.json``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", required=True)
    args = parser.parse_args()
    record = {"rank": int(os.environ["RANK"]), "ddp": 0, "forwards": 0, "saves": [], "sampled": []}
    # as on 2 machines with one process each: local ranks repeat on every machine (notebook 08, section 2)
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=os.environ["RANK"])
    save, init, forward = torch.save, DistributedDataParallel.__init__, DistributedDataParallel.forward
    sample = DistributedSampler.__iter__

    def noting_save(obj, f, *a, **k):
        record["saves"].append(str(f) if isinstance(f, (str, os.PathLike)) else str(getattr(f, "name", f)))
        return save(obj, f, *a, **k)

    def noting_init(self, *a, **k):
        record["ddp"] += 1
        init(self, *a, **k)

    def noting_forward(self, *a, **k):
        record["forwards"] += 1
        return forward(self, *a, **k)

    def noting_sample(self):
        for i in sample(self):
            record["sampled"].append(int(i))
            yield i

    torch.save, DistributedDataParallel.__init__, DistributedDataParallel.forward = (
        noting_save,
        noting_init,
        noting_forward,
    )
    DistributedSampler.__iter__ = noting_sample
    try:
        main(Path(args.out))
    finally:
        torch.save, DistributedDataParallel.__init__, DistributedDataParallel.forward = save, init, forward
        DistributedSampler.__iter__ = sample
        record["read"] = list(_READ)
        record["left the group"] = not dist.is_initialized()
        Path(args.record, f"rank{record['rank']}.json").write_text(json.dumps(record), encoding="utf-8")
        if dist.is_initialized():  # the program forgot: leave it here, so that the process exits cleanly
            dist.destroy_process_group()
