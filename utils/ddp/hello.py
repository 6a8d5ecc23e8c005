"""The smallest distributed program: who am I, and three collectives.

    torchrun --standalone --nproc_per_node=2 -m utils.ddp.hello

Each rank reports the variables torchrun set for it, the backend and device it chose, and the
results of ``all_reduce`` (sum), ``all_gather`` and ``broadcast``. The port number is random, so
only whether ``MASTER_PORT`` is set is printed (the value is saved with ``--out``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from utils.ddp.common import TORCHRUN_VARS, base_parser, distributed, report, save_result


def main(argv: list[str] | None = None) -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    env = {name: os.environ.get(name) for name in TORCHRUN_VARS}
    shown = {k: v for k, v in env.items() if k != "MASTER_PORT"}
    report(" ".join(f"{k}={v}" for k, v in shown.items()) + f" MASTER_PORT set: {env['MASTER_PORT'] is not None}")
    with distributed(args.device) as info:
        report(f"backend={info.backend} device={info.device}")
        x = torch.tensor([float(info.rank + 1)], device=info.device)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)  # in place, on every rank
        gathered = [torch.zeros(1, dtype=torch.long, device=info.device) for _ in range(info.world_size)]
        dist.all_gather(gathered, torch.tensor([info.rank], device=info.device))
        token = torch.tensor([42 if info.rank == 0 else -1], device=info.device)
        dist.broadcast(token, src=0)  # rank 0's value overwrites everyone's
        report(f"all_reduce(rank+1)={x.item():g} all_gather(rank)={[int(g.item()) for g in gathered]} "
               f"broadcast from 0={token.item()}")
        result = {"env": env, "backend": info.backend, "device": str(info.device), "sum": x.item(),
                  "gathered": [int(g.item()) for g in gathered], "token": int(token.item())}
    result["destroyed"] = not dist.is_initialized()
    report(f"process group destroyed: {result['destroyed']}")
    save_result(args.out, result)


if __name__ == "__main__":
    main()
