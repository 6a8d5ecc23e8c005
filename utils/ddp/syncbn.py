"""Synchronised BatchNorm written by hand: one all_reduce forward, one backward.

    torchrun --standalone --nproc_per_node=2 -m utils.ddp.syncbn --out runs/syncbn

Each rank normalises its shard of one global batch. Plain BatchNorm would use the shard's own
mean and variance; synchronised BatchNorm (同步BN) uses the statistics of the *whole* batch. The
notes' derivation: var = E[x^2] - E[x]^2, so the global mean and variance follow from three
sums that add up across ranks, ``sum(x)``, ``sum(x^2)`` and the count, which travel together in
**one** ``all_reduce``. The backward pass needs two more global sums per channel, ``sum(dy)`` and
``sum(dy * x_hat)``: one more ``all_reduce``.

Every rank checks its output and gradients against BatchNorm over the whole batch (each rank can
compute that reference because the global batch comes from a shared seed), reports the number of
collectives, and on CUDA also runs ``nn.SyncBatchNorm`` (converted with
``convert_sync_batchnorm``); on the CPU it reports the error ``nn.SyncBatchNorm`` raises there.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from utils.ddp.common import base_parser, distributed, report, save_result

COLLECTIVES: Counter = Counter()
"""How many all_reduce calls the forward and backward passes made, and how many numbers they carried."""


def _all_reduce(t: torch.Tensor, phase: str) -> torch.Tensor:
    COLLECTIVES[f"{phase} calls"] += 1
    COLLECTIVES[f"{phase} numbers"] += t.numel()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch normalisation with statistics summed over every rank of the default process group."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):  # noqa: D102 - documented on the class
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]  # every dimension except the channels
        count = torch.full((1,), x.numel() // c, dtype=x.dtype, device=x.device)
        stats = _all_reduce(torch.cat([x.sum(dims), (x * x).sum(dims), count]), "forward")  # ONE collective
        total, total_sq, n = stats[:c], stats[c:2 * c], stats[2 * c]
        mean = total / n
        var = total_sq / n - mean * mean  # biased variance, as BatchNorm normalises with it
        invstd = torch.rsqrt(var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        x_hat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.n, ctx.dims, ctx.shape = n, dims, shape
        ctx.mark_non_differentiable(mean, var, n)
        return x_hat * weight.view(shape) + bias.view(shape), mean, var, n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):  # noqa: D102
        x_hat, weight, invstd = ctx.saved_tensors
        dims, shape, n = ctx.dims, ctx.shape, ctx.n
        c = x_hat.shape[1]
        grad_bias = dy.sum(dims)  # this rank's share; DDP would average them across ranks
        grad_weight = (dy * x_hat).sum(dims)
        sums = _all_reduce(torch.cat([grad_bias, grad_weight]), "backward")  # ONE collective
        sum_dy, sum_dy_xhat = sums[:c].view(shape), sums[c:].view(shape)
        grad_x = (weight * invstd).view(shape) / n * (n * dy - sum_dy - x_hat * sum_dy_xhat)
        return grad_x, grad_weight, grad_bias, None


class HandSyncBatchNorm(nn.Module):
    """A drop-in BatchNorm (any input ``(N, C, *)``) that synchronises statistics in training mode.

    Same parameter and buffer names as ``nn.BatchNorm*d``, so state dicts are interchangeable.
    Outside a process group (or in eval mode) it is ordinary BatchNorm.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.weight.numel():
            raise ValueError(f"expected input (N, {self.weight.numel()}, *), got shape {tuple(x.shape)}")
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training, self.momentum, self.eps)
        y, mean, var, n = SyncBatchNormFunction.apply(x, self.weight, self.bias, self.eps)
        with torch.no_grad():  # running statistics use the unbiased variance, like nn.BatchNorm
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)
            self.num_batches_tracked += 1
        return y


def make_inputs(world_size: int, per_rank: int = 4, channels: int = 3, length: int = 5, seed: int = 0):
    """The global batch ``x`` (mean 3, std 2), an upstream gradient ``g`` and BatchNorm's ``weight, bias``."""
    gen = torch.Generator().manual_seed(seed)
    x = 3 + 2 * torch.randn(world_size * per_rank, channels, length, generator=gen)
    g = torch.randn(world_size * per_rank, channels, length, generator=gen)
    weight = 1 + 0.1 * torch.randn(channels, generator=gen)
    bias = 0.1 * torch.randn(channels, generator=gen)
    return x, g, weight, bias


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--per-rank", type=int, default=4, help="samples per rank")
    args = parser.parse_args(argv)
    with distributed(args.device) as info:
        dev, r, b = info.device, info.rank, args.per_rank
        x, g, weight, bias = (t.to(dev) for t in make_inputs(info.world_size, b))
        mine = slice(r * b, (r + 1) * b)

        # the reference: BatchNorm over the whole global batch (every rank can compute it here)
        x_full = x.clone().requires_grad_()
        w_full, b_full = weight.clone().requires_grad_(), bias.clone().requires_grad_()
        y_full = F.batch_norm(x_full, None, None, w_full, b_full, training=True)
        (y_full * g).sum().backward()

        bn = HandSyncBatchNorm(x.shape[1]).to(dev)
        with torch.no_grad():
            bn.weight.copy_(weight)
            bn.bias.copy_(bias)
        x_local = x[mine].clone().requires_grad_()
        y_local = bn(x_local)
        (y_local * g[mine]).sum().backward()  # this rank's part of the global loss
        grad_w, grad_b = bn.weight.grad.clone(), bn.bias.grad.clone()
        dist.all_reduce(grad_w)  # what DDP does with parameter gradients (it then divides by world size)
        dist.all_reduce(grad_b)
        fwd_ok = torch.allclose(y_local, y_full[mine], atol=1e-5)
        bwd_ok = (torch.allclose(x_local.grad, x_full.grad[mine], atol=1e-5)
                  and torch.allclose(grad_w, w_full.grad, atol=1e-4) and torch.allclose(grad_b, b_full.grad, atol=1e-4))
        report(f"hand-written SyncBN == BatchNorm over the global batch: forward {fwd_ok}, backward {bwd_ok}")
        report(f"collectives: forward {COLLECTIVES['forward calls']} all_reduce of {COLLECTIVES['forward numbers']} "
               f"numbers, backward {COLLECTIVES['backward calls']} all_reduce of {COLLECTIVES['backward numbers']} numbers")
        y_plain = F.batch_norm(x[mine], None, None, weight, bias, training=True)  # shard statistics only
        report(f"plain BatchNorm on my shard == global BatchNorm: {torch.allclose(y_plain, y_full[mine], atol=1e-5)}")

        # PyTorch's own: convert_sync_batchnorm swaps every BatchNorm*d for nn.SyncBatchNorm
        net = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(x.shape[1]))).to(dev)
        with torch.no_grad():
            net[0].weight.copy_(weight)
            net[0].bias.copy_(bias)
        torch_sync = None
        try:
            torch_sync = net(x[mine])
            report(f"nn.SyncBatchNorm on {dev.type} == global BatchNorm: "
                   f"{torch.allclose(torch_sync, y_full[mine], atol=1e-5)}")
        except ValueError as err:
            report(f"nn.SyncBatchNorm on {dev.type}: {type(err).__name__}: {err}")
        save_result(args.out, {
            "y": y_local.detach().cpu(), "grad_x": x_local.grad.cpu(), "grad_w_local": bn.weight.grad.cpu(),
            "grad_b_local": bn.bias.grad.cpu(), "running_mean": bn.running_mean.cpu(),
            "running_var": bn.running_var.cpu(), "y_plain": y_plain.cpu(),
            "torch_sync": None if torch_sync is None else torch_sync.detach().cpu(),
            "collectives": dict(COLLECTIVES), "per_rank": b,
        })


if __name__ == "__main__":
    main()
