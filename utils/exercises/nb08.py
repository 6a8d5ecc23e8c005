"""Checks for the exercises of notebook 08 · DataParallel and DDP (``notebooks/src/08_data_parallel_ddp.py``).
Used by notebook 08, whose ``Checker("08")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.

Nothing here starts a process or a process group: the distributed ideas are checked as plain functions
(ranks as arithmetic, ``DistributedSampler`` as index lists, SyncBN as a merge of per-rank statistics).
"""

import math
import operator

import torch
from torch.utils.data.distributed import DistributedSampler

from utils.exercises import Registry, expect, hint, number_answer, returns

EXERCISES = Registry("08")

RANKS = "2. Processes, ranks, and how to start them"
PROGRAM = "3. A DDP program, written here and run by `torchrun`"
SYNCBN = "4. Synchronised BatchNorm, written by hand"
LR = "7. Bigger global batch, bigger learning rate: linear scaling with warm-up"
FLOATS = "07 · 1. Why 16 bits, and what breaks"


@EXERCISES.exercise(1, "Ranks, all-reduces and the learning rate of a 2-machine job (predict)", RANKS)
def ranks_and_allreduces(rank, world_size, local_world_size, no_sync_both, no_sync_backward, peak_lr):
    rank, world_size, local_world_size = (
        number_answer(v, n)
        for v, n in ((rank, "RANK"), (world_size, "WORLD_SIZE"), (local_world_size, "LOCAL_WORLD_SIZE"))
    )
    if world_size == 2:
        hint("WORLD_SIZE counts processes, not machines (the notes' mistake): 2 machines × 4 processes")
    expect(
        world_size == 8,
        f"WORLD_SIZE = {world_size}: it is the number of processes in the whole job, all machines together",
    )
    if local_world_size == 8:
        hint("LOCAL_WORLD_SIZE counts the processes on this machine only (`--nproc_per_node`)")
    expect(
        local_world_size == 4,
        f"LOCAL_WORLD_SIZE = {local_world_size}: it is `--nproc_per_node`, the processes on one machine",
    )
    if rank == 2:
        hint(
            "2 is this process's LOCAL_RANK, which repeats on every machine; RANK is global: "
            "GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK"
        )
    if rank == 1:
        hint(
            "1 is the machine's index (the node rank, GROUP_RANK), what the notes call the rank; RANK numbers "
            "processes: GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK"
        )
    expect(rank == 6, f"RANK = {rank}: the global rank is GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK")

    no_sync_both = number_answer(no_sync_both, "allreduces_no_sync")
    no_sync_backward = number_answer(no_sync_backward, "allreduces_no_sync_backward")
    if no_sync_both == 1:
        hint(
            "(a): DDP all-reduces bucket by bucket, so the one synchronised backward (the last micro-batch's) "
            "makes one all-reduce per bucket",
            PROGRAM,
        )
    if no_sync_both == 12:
        hint(
            "(a): with forward *and* backward inside `no_sync()`, micro-batches 1-3 communicate nothing; only "
            "the last one's backward all-reduces",
            PROGRAM,
        )
    expect(
        no_sync_both == 3,
        f"(a) = {no_sync_both}: count the synchronised backwards, times the buckets each one all-reduces (Proof (3))",
        PROGRAM,
    )
    if no_sync_backward == 3:
        hint(
            "(b): DDP decides in the *forward* whether the next backward synchronises; `no_sync()` around "
            "the backward alone changes nothing, every micro-batch all-reduces",
            PROGRAM,
        )
    if no_sync_backward == 4:
        hint("(b): each of the 4 synchronised backwards all-reduces each of the 3 buckets", PROGRAM)
    expect(
        no_sync_backward == 12,
        f"(b) = {no_sync_backward}: see Proof (3), where `no_sync()` around the "
        "backward only made as many all-reduces as no `no_sync()` at all",
        PROGRAM,
    )

    peak_lr = number_answer(peak_lr, "peak_lr")
    if math.isclose(peak_lr, 0.1):
        hint(
            "peak_lr: 8 processes × 32 samples is one micro-step; one optimizer step sees 4 micro-batches "
            "on each of the 8 processes",
            LR,
        )
    if math.isclose(peak_lr, 0.05) or math.isclose(peak_lr, 0.2):
        hint("peak_lr: one optimizer step sees the micro-batches of all 8 processes (both machines), 4 each", LR)
    expect(
        math.isclose(peak_lr, 0.4, rel_tol=1e-6),
        f"peak_lr = {peak_lr}: lr = 0.1 × (samples per optimizer "
        "step) / 256, with samples per step = processes × micro-batches × 32",
        LR,
    )


def _as_indices(out) -> list[int]:
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    try:
        return [operator.index(i) for i in out]
    except TypeError:
        hint(f"return a list of int indices, not {type(out).__name__} {out!r:.80}")


def _reference(n, rank, world_size, shuffle=False, seed=0, epoch=0, drop_last=False) -> list[int]:
    sampler = DistributedSampler(
        range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return list(sampler)


@EXERCISES.exercise(2, "DistributedSampler, written by hand (write a function)", PROGRAM)
def shard_indices_check(fn):
    shards = [_as_indices(returns(fn, 10, r, 4)) for r in range(4)]
    expected = [_reference(10, r, 4) for r in range(4)]
    if shards[0][:3] == [0, 1, 2]:
        hint(
            "rank 0 got a contiguous block; DistributedSampler strides: rank r takes positions r, r + W, "
            "r + 2W, ... of the order (Proof (1))"
        )
    if shards == [list(range(10))[r::4] for r in range(4)]:
        hint(
            "the ranks got 3, 3, 2 and 2 indices; every rank must run the same number of steps, so the sampler "
            "pads the order to a multiple of world_size by repeating indices from its start (Proof (4))"
        )
    expect(
        [len(s) for s in shards] == [3, 3, 3, 3],
        f"10 samples on 4 ranks: every rank gets ceil(10 / 4) = 3 indices, yours got {[len(s) for s in shards]}",
    )
    expect(
        shards == expected,
        f"10 samples on 4 ranks, no shuffle: expected {expected}, got {shards}; the "
        "padding repeats the first indices of the order (0, 1), and rank r takes positions r, r + 4 and r + 8",
    )

    dropped = [_as_indices(returns(fn, 10, r, 4, drop_last=True)) for r in range(4)]
    expected = [_reference(10, r, 4, drop_last=True) for r in range(4)]
    expect(
        dropped == expected,
        f"drop_last=True drops the tail instead of padding: 10 samples on 4 ranks give {expected}, yours {dropped}",
    )

    shuffled = [_as_indices(returns(fn, 10, r, 2, shuffle=True, seed=5, epoch=3)) for r in range(2)]
    expected = [_reference(10, r, 2, shuffle=True, seed=5, epoch=3) for r in range(2)]
    if shuffled != expected:
        if sorted(shuffled[0] + shuffled[1]) != list(range(10)):
            hint(
                "with shuffle=True the two ranks' shards overlap or miss samples: every rank must draw the "
                "*same* permutation (a generator seeded with seed + epoch, not with the rank) and take its "
                "positions of it"
            )
        again = [_as_indices(returns(fn, 10, r, 2, shuffle=True, seed=5, epoch=3)) for r in range(2)]
        if again != shuffled:
            hint(
                "two calls with the same arguments gave different shards: draw the permutation from your own "
                "`torch.Generator()` seeded with seed + epoch, not from the global random state"
            )
        if shuffled == [_reference(10, r, 2, shuffle=True, seed=5) for r in range(2)]:
            hint(
                "epoch is ignored: the permutation is seeded with seed + epoch, which is what `set_epoch` "
                "changes (Proof (4))"
            )
        hint(
            f"shuffle=True, seed=5, epoch=3 on 2 ranks: expected {expected}, got {shuffled}; the sampler uses "
            "`torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))` (Proof (1))"
        )

    small = [_as_indices(returns(fn, 3, r, 8)) for r in range(8)]
    expected = [_reference(3, r, 8) for r in range(8)]
    expect(
        small == expected,
        f"3 samples on 8 ranks: expected {expected}, got {small}; the padding (5 indices) "
        "is longer than the order itself, so it repeats the order more than once",
    )

    for n in range(1, 14):
        for world_size in range(1, 6):
            for shuffle in (False, True):
                for drop_last in (False, True):
                    for rank in range(world_size):
                        args = dict(shuffle=shuffle, seed=n, epoch=world_size, drop_last=drop_last)
                        got = _as_indices(returns(fn, n, rank, world_size, **args))
                        want = _reference(n, rank, world_size, **args)
                        expect(
                            got == want,
                            f"n={n}, rank={rank}, world_size={world_size}, {args}: expected {want}, got {got}",
                        )


def _stats(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    var_mean = [torch.var_mean(x, dim=0, correction=0) for x in xs]
    return (
        torch.stack([m for _, m in var_mean]),
        torch.stack([v for v, _ in var_mean]),
        torch.tensor([len(x) for x in xs]),
    )


@EXERCISES.exercise(3, "Merge the ranks' BatchNorm statistics like nn.SyncBatchNorm (stretch)", SYNCBN)
def merge_bn_stats_check(fn):
    g = torch.Generator().manual_seed(8)
    counts = [2, 7, 3, 12]  # 4 ranks, uneven batches; 3 channels
    xs = [
        torch.randn(c, 3, generator=g) * torch.tensor([1.0, 2.0, 0.5]) + 3 * torch.randn(1, 3, generator=g)
        for c in counts
    ]
    means, variances, n = _stats(xs)
    out = returns(fn, means.clone(), variances.clone(), n.clone())
    expect(
        isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out),
        "return a pair of tensors: (mean, var)",
    )
    mean, var = out
    expect(
        tuple(mean.shape) == tuple(var.shape) == (3,),
        f"mean and var should have one value per channel, "
        f"shape (3,), not {tuple(mean.shape)} and {tuple(var.shape)}: reduce over the ranks (dim 0)",
    )
    expect(
        mean.dtype == var.dtype == means.dtype,
        f"return the inputs' dtype {means.dtype} (got {mean.dtype}, "
        f"{var.dtype}): running_mean and running_var are {means.dtype} buffers",
    )
    ref_var, ref_mean = torch.var_mean(torch.cat(xs).double(), dim=0, correction=0)
    if torch.allclose(mean.double(), ref_var, atol=1e-5) and torch.allclose(var.double(), ref_mean, atol=1e-5):
        hint("the pair is in the wrong order: return (mean, var), although `torch.var_mean` returns (var, mean)")
    if torch.allclose(mean.double(), means.double().mean(0), atol=1e-5):
        hint(
            "the mean of the ranks' means weights a rank with 2 samples like one with 12: weight each rank's "
            "mean by its count"
        )
    expect(
        torch.allclose(mean.double(), ref_mean, atol=1e-5),
        f"mean: expected {ref_mean.tolist()}, got "
        f"{mean.tolist()}: the global mean is the count-weighted mean of the ranks' means",
    )
    total = n.sum().double()
    weighted_var = (n.double()[:, None] * variances.double()).sum(0) / total
    if torch.allclose(var.double(), weighted_var, atol=1e-5) or torch.allclose(
        var.double(), variances.double().mean(0), atol=1e-5
    ):
        hint(
            "var only averages the ranks' variances, each measured around its *own* mean: the global variance "
            "also counts how far each rank's mean lies from the global mean (the law of total variance)"
        )
    if torch.allclose(var.double(), ref_var * total / (total - 1), atol=1e-5):
        hint(
            "this is the unbiased variance (÷ (N − 1)); BatchNorm normalises with the biased one (÷ N), the "
            "variance the ranks' `variances` are measured with too"
        )
    expect(torch.allclose(var.double(), ref_var, atol=1e-5), f"var: expected {ref_var.tolist()}, got {var.tolist()}")
    off = (means[0].double() - ref_mean).abs().max().item()

    # Activations far from zero: E[x²] − E[x]² cancels catastrophically in float32.
    counts = [5, 16, 9, 1, 11]
    xs = [1e4 + torch.randn(c, 2, generator=g) for c in counts]
    means, variances, n = _stats(xs)
    mean, var = returns(fn, means, variances, n)
    ref_var, ref_mean = torch.var_mean(torch.cat(xs).double(), dim=0, correction=0)
    expect(
        torch.allclose(mean.double(), ref_mean, rtol=1e-6, atol=0),
        f"inputs around 10,000: mean expected {ref_mean.tolist()}, got {mean.tolist()}",
    )
    expect(
        torch.allclose(var.double(), ref_var, rtol=0, atol=5e-3),
        f"right for data near 0 but not for data near "
        f"10,000 with spread 1: var expected {[round(v, 4) for v in ref_var.tolist()]}, got {var.tolist()}. "
        "E[x²] − E[x]² subtracts two numbers near 10⁸, which float32 stores in steps of 8, so the difference "
        "(about 1) is lost; combine deviations from the global mean instead",
        FLOATS,
    )
    return (
        f"In the first test, rank 0's own 2 samples gave a mean up to {off:.1f} away from the global batch's: "
        "with small per-GPU batches, plain BatchNorm normalises with the wrong statistics, the notes' reason to "
        "synchronise BN"
    )
