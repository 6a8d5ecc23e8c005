"""DDP training of the notes' ToyModel, with a DistributedSampler, per-epoch checkpoints and an optional crash.

    torchrun --standalone --nproc_per_node=2 -m utils.ddp.train --epochs 3 --batch-size 8 \\
        --ckpt-dir runs/ddp_ckpt --out runs/ddp_out
    # fault tolerance: worker N-1 crashes once before step 6; torchrun restarts the group
    torchrun --standalone --nproc_per_node=2 --max_restarts=1 -m utils.ddp.train ... --crash-at-step 6

What each rank does:

1. builds the model from a *different* seed on each rank and reports that the parameters differ
   before ``DistributedDataParallel(...)`` and are equal after it (the constructor broadcasts
   rank 0's parameters);
2. resumes from ``--ckpt-dir/last.pt`` when it exists (after a restart), else starts fresh;
3. trains ``--epochs`` epochs on its shard of the data (``DistributedSampler`` +
   ``set_epoch``), batch ``--batch-size`` per rank, so the global batch is ``world_size`` times that;
4. after each epoch: rank 0 saves a checkpoint (temporary file + ``os.replace``), all ranks wait
   at ``barrier()``, then every rank loads it with ``map_location`` onto its own device and checks
   that it holds exactly its own parameters;
5. writes its final parameters and the indices of its shards to ``--out/rank<N>.pt``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from utils.ddp.common import atomic_save, base_parser, distributed, report, save_result


class ToyModel(nn.Module):
    """The notes' DDP example: Linear(10, 10) -> ReLU -> Linear(10, 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def make_model(seed: int) -> ToyModel:
    """A ToyModel whose initial parameters depend only on ``seed``."""
    torch.manual_seed(seed)
    return ToyModel()


def make_data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A small regression set: ``n`` inputs of size 10, targets of size 5 (the same on every rank)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, 5, generator=g) / 10**0.5
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 5, generator=g)
    return x, y


def equal_on_all_ranks(module: nn.Module) -> bool:
    """True when every rank holds exactly rank 0's parameters (one all_gather of the flattened parameters)."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=None, help="checkpoint folder (rank 0 writes last.pt)")
    parser.add_argument("--crash-at-step", type=int, default=-1,
                        help="on the first attempt, the last rank exits abruptly before this global step")
    args = parser.parse_args(argv)

    with distributed(args.device) as info:
        device = info.device
        x, y = make_data(args.samples, args.seed)
        dataset = TensorDataset(x, y)
        model = make_model(args.seed + info.rank).to(device)  # a different start on every rank ...
        before = equal_on_all_ranks(model)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        after = equal_on_all_ranks(model)  # ... until DDP broadcasts rank 0's parameters
        report(f"parameters equal on all ranks: before DDP() {before}, after DDP() {after}")
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
        sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank,
                                     shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

        ckpt = Path(args.ckpt_dir) / "last.pt" if args.ckpt_dir else None
        start_epoch, step = 0, 0
        if ckpt is not None and ckpt.exists():
            state = torch.load(ckpt, map_location=device, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start_epoch, step = state["epoch"] + 1, state["step"]
            report(f"attempt {info.restart_count}: resumed from the checkpoint of epoch {state['epoch']} (step {step})")
        else:
            report(f"attempt {info.restart_count}: fresh start")

        shards: dict[int, list[int]] = {}
        for epoch in range(start_epoch, args.epochs):
            sampler.set_epoch(epoch)  # without it every epoch would repeat epoch 0's order
            shards[epoch] = list(iter(sampler))
            for xb, yb in loader:
                if step == args.crash_at_step and info.restart_count == 0 and info.rank == info.world_size - 1:
                    report(f"attempt 0: simulated crash before step {step}")
                    os._exit(1)  # a hard crash: no cleanup, like a killed process or an OOM
                xb, yb = xb.to(device), yb.to(device)
                loss = F.mse_loss(ddp(xb), yb)
                opt.zero_grad()
                loss.backward()  # DDP averages the gradients of all ranks during backward
                opt.step()
                step += 1
            if ckpt is not None:
                if info.rank == 0:  # the parameters are the same everywhere: one writer is enough
                    atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "epoch": epoch, "step": step}, ckpt)
                dist.barrier()  # nobody reads before rank 0 has finished writing
                state = torch.load(ckpt, map_location=device, weights_only=True)  # onto *this* rank's device
                same = all(torch.equal(v, state["model"][k]) for k, v in model.state_dict().items())
                report(f"epoch {epoch}: checkpoint written by rank 0, loaded here with map_location={device}: "
                       f"equals my parameters {same}")
        final_equal = equal_on_all_ranks(model)
        report(f"done after {step} steps; parameters equal on all ranks: {final_equal}")
        save_result(args.out, {
            "params": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "shards": shards, "steps": step, "restart_count": info.restart_count,
            "equal_before_ddp": before, "equal_after_ddp": after, "final_equal": final_equal,
        })


if __name__ == "__main__":
    main()
