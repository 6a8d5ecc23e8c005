"""Checks for the exercises of notebook 08 · DataParallel and DDP (``notebooks/src/08_data_parallel_ddp.py``).
Used by notebook 08, whose ``Checker("08")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.

Exercises 1-3 start no process: their distributed ideas are checked as plain functions (ranks as arithmetic,
``DistributedSampler`` as index lists, SyncBN as a merge of per-rank statistics). Exercise 4 is a DDP program: its
check writes the learner's cell to ``notebooks/runs/ex4_ddp.py`` and runs it with ``torchrun`` on 2 CPU processes
(gloo), as section 3 runs ``ddp_train.py``; what each rank did comes back through :mod:`utils.ddp.exercise`.
"""

import ast
import contextlib
import json
import math
import operator
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from utils.exercises import NotAttempted, Registry, expect, hint, number_answer, returns, rules
from utils.exercises.rules import counting_calls, refers_to

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
        hint("WORLD_SIZE counts processes, not machines (the notes' mistake)")
    expect(
        world_size == 8,
        f"WORLD_SIZE = {world_size}: it is the number of processes in the whole job, all machines together",
    )
    if local_world_size == 8:
        hint("LOCAL_WORLD_SIZE counts the processes on this machine only, not in the whole job")
    expect(
        local_world_size == 4,
        f"LOCAL_WORLD_SIZE = {local_world_size}: which `torchrun` option sets the processes of one machine?",
    )
    if rank == 2:
        hint(
            "2 is this process's LOCAL_RANK, which repeats on every machine; RANK is global, one number per process "
            "of the whole job: section 2 shows how torchrun derives it from the machine's index and LOCAL_RANK"
        )
    if rank == 1:
        hint(
            "1 is the machine's index (the node rank, GROUP_RANK), what the notes call the rank; RANK numbers "
            "processes, not machines: section 2 shows how torchrun derives it"
        )
    expect(
        rank == 6,
        f"RANK = {rank}: the global rank numbers all processes of the job, machine after machine; section 2 "
        "asserts how torchrun computes it",
    )

    no_sync_both = number_answer(no_sync_both, "allreduces_no_sync")
    no_sync_backward = number_answer(no_sync_backward, "allreduces_no_sync_backward")
    if no_sync_both == 1:
        hint(
            "(a): one synchronised backward is not one all-reduce call: DDP sends the gradients bucket by bucket",
            PROGRAM,
        )
    if no_sync_both == 12:
        hint(
            "(a): with forward *and* backward inside `no_sync()`, micro-batches 1-3 communicate nothing (Proof (3))",
            PROGRAM,
        )
    expect(
        no_sync_both == 3,
        f"(a) = {no_sync_both}: which backwards synchronise, and how many all-reduce calls does each make? (Proof (3))",
        PROGRAM,
    )
    if no_sync_backward == 3:
        hint(
            "(b): DDP decides in the *forward* whether the next backward synchronises; `no_sync()` around "
            "the backward alone comes too late (Proof (3))",
            PROGRAM,
        )
    if no_sync_backward == 4:
        hint(
            "(b): 4 counts synchronised backwards, not all-reduce calls: how many calls does one synchronised "
            "backward make?",
            PROGRAM,
        )
    expect(
        no_sync_backward == 12,
        f"(b) = {no_sync_backward}: Proof (3) counted the all-reduces with `no_sync()` around the backward only",
        PROGRAM,
    )

    peak_lr = number_answer(peak_lr, "peak_lr")
    if math.isclose(peak_lr, 0.1):
        hint(
            "peak_lr: 8 processes × 32 samples is the global batch of one micro-step, but the optimizer steps "
            "only after the accumulated micro-batches: count every sample one optimizer step averages over",
            LR,
        )
    if math.isclose(peak_lr, 0.05) or math.isclose(peak_lr, 0.2):
        hint(
            "peak_lr: your global batch leaves out the other machine's processes or some of the accumulated "
            "micro-batches",
            LR,
        )
    expect(
        math.isclose(peak_lr, 0.4, rel_tol=1e-6),
        f"peak_lr = {peak_lr}: section 7's rule scales the learning rate with the global batch; count every "
        "sample that one optimizer step averages over, on all machines",
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


_LIBRARY_SAMPLER = (
    "the exercise asks you to write what it does (the order, the padding, the split between ranks): knowing that "
    "is how you predict which samples a rank sees, and why a missing `set_epoch` repeats an epoch"
)


def _code_key(code: types.CodeType) -> tuple:
    """What a copy of a function's source keeps: its name, variables, attribute names and constants."""
    consts = tuple(c.co_name if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.co_name, code.co_varnames, code.co_names, consts


_SAMPLER_CODE = {_code_key(f.__code__) for f in (DistributedSampler.__init__, DistributedSampler.__iter__)}


@contextlib.contextmanager
def _running_sampler_code() -> Iterator[list[bool]]:
    """Notes whether the block ran DistributedSampler's ``__init__`` or ``__iter__``: the methods themselves, kept
    aside before the check patched the class, or a copy compiled from their source
    (``exec(inspect.getsource(...))``)."""
    seen = [False]
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and _code_key(frame.f_code) in _SAMPLER_CODE:
            seen[0] = True

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


@EXERCISES.exercise(2, "DistributedSampler, written by hand (write a function)", PROGRAM)
def shard_indices_check(learners_fn):
    if used := refers_to(learners_fn, "DistributedSampler"):
        hint(f"`shard_indices` uses `{used}`, the class it should reproduce: {_LIBRARY_SAMPLER}")

    def fn(*args, **kwargs):  # the learner's function, watched: does it run a DistributedSampler however named?
        with (
            counting_calls(DistributedSampler, "__iter__") as iterated,
            counting_calls(DistributedSampler, "__init__") as built,
            _running_sampler_code() as copied,
        ):
            out = learners_fn(*args, **kwargs)
        if iterated[0] or built[0]:
            hint(f"`shard_indices` ran a `DistributedSampler`, the class it should reproduce: {_LIBRARY_SAMPLER}")
        if copied[0]:
            hint(
                f"`shard_indices` ran `DistributedSampler`'s own code (a method kept aside, or a copy of its "
                f"source): {_LIBRARY_SAMPLER}"
            )
        return out

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
            f"shuffle=True, seed=5, epoch=3 on 2 ranks: expected {expected}, got {shuffled}; compare how you draw "
            "the permutation (which function, which generator, seeded with what) with Proof (1)"
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
    if used := refers_to(fn, "batch_norm_gather_stats_with_counts", "batch_norm_gather_stats"):
        hint(
            f"`merge_bn_stats` calls `{used}`, the kernel it should reproduce (a CUDA kernel: on the CPU it raises "
            "NotImplementedError); the exercise asks you to write the merge, which is what that kernel computes"
        )
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

    # Ranks, channels and data drawn afresh on every run: an answer cannot be a table of the tests' results.
    fresh = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    ranks, channels = (int(torch.randint(lo, hi, (), generator=fresh)) for lo, hi in ((2, 7), (1, 6)))
    counts = torch.randint(1, 13, (ranks,), generator=fresh).tolist()
    offset = 100 * torch.rand(channels, generator=fresh) - 50
    xs = [
        offset + (0.5 + 3 * torch.rand(channels, generator=fresh)) * torch.randn(c, channels, generator=fresh)
        for c in counts
    ]
    means, variances, n = _stats(xs)
    mean, var = returns(fn, means, variances, n)
    ref_var, ref_mean = torch.var_mean(torch.cat(xs).double(), dim=0, correction=0)
    expect(
        tuple(mean.shape) == tuple(var.shape) == (channels,)
        and torch.allclose(mean.double(), ref_mean, rtol=1e-5, atol=1e-4)
        and torch.allclose(var.double(), ref_var, rtol=1e-4, atol=1e-4),
        f"{ranks} ranks with {counts} samples, {channels} channels (drawn afresh on every run): mean expected "
        f"{[round(v, 4) for v in ref_mean.tolist()]}, got {mean.tolist()}; var expected "
        f"{[round(v, 4) for v in ref_var.tolist()]}, got {var.tolist()}",
    )

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

    # float64 activations around 10¹⁵⁵: a wider dtype is no way out, their squares overflow even float64. The spread,
    # 10¹⁵⁰, is 10⁻⁵ of the offset: float64 keeps the data, and so the ranks' means, to about 10⁻¹¹ of the spread,
    # and every stable merge (law of total variance, Chan's pairwise merge, a shift by rank 0's mean) lands within
    # about 5·10⁻¹¹ of the exact variance, far inside rtol 10⁻⁸; a rescaled E[x²] − E[x]² cancels 10 of float64's 16
    # digits and misses by about 10⁻⁶.
    counts = [4, 9, 2, 7]
    xs = [1e155 + 1e150 * torch.randn(c, 2, generator=g, dtype=torch.float64) for c in counts]
    means, variances, n = _stats(xs)
    mean, var = returns(fn, means, variances, n)
    expect(
        mean.dtype == var.dtype == torch.float64,
        f"float64 inputs: return float64 (got {mean.dtype}, {var.dtype}), the inputs' dtype",
    )
    ref_var, ref_mean = torch.var_mean(torch.cat(xs), dim=0, correction=0)
    expect(
        torch.allclose(mean, ref_mean, rtol=1e-9, atol=0),
        f"float64 inputs around 10¹⁵⁵: mean expected {ref_mean.tolist()}, got {mean.tolist()}",
    )
    if not torch.isfinite(var).all():
        hint(
            f"right in float32 near 10,000, but float64 activations around 10¹⁵⁵ (spread 10¹⁵⁰) gave var = "
            f"{var.tolist()}: E[x²] is about 10³¹⁰, past float64's largest number (about 1.8·10³⁰⁸), so it "
            "overflows (inf, and inf − inf is nan). Computing in a wider dtype only moves the problem to larger "
            "activations (and doubles the bytes of the all-reduce); the stretch asks for a merge that never squares "
            "the activations themselves, only deviations from a mean",
            FLOATS,
        )
    error = ((var - ref_var).abs() / ref_var).max().item()
    expect(
        torch.allclose(var, ref_var, rtol=1e-8, atol=0),
        f"float64 inputs around 10¹⁵⁵ with spread 10¹⁵⁰: var expected {ref_var.tolist()}, got {var.tolist()} "
        f"(relative error {error:.1g}, where a stable merge's is under 10⁻¹⁰). Somewhere your merge subtracts "
        "two nearly equal numbers of the size of the offset, or of its square, rescaled or not: the digits of the "
        "spread are lost there. Combine deviations from a mean, which are of the size of the spread",
        FLOATS,
    )
    return (
        f"In the first test, rank 0's own 2 samples gave a mean up to {off:.1f} away from the global batch's: "
        "with small per-GPU batches, plain BatchNorm normalises with the wrong statistics, the notes' reason to "
        "synchronise BN"
    )


# --- Exercise 4: a DDP program, launched on 2 processes -----------------------------------------------------------

PROGRAM_FILE = "ex4_ddp.py"
"""What the check writes into ``notebooks/runs/``: the exercise cell, then :data:`FOOTER`."""
FOOTER = """

# --- added by the check of exercise 4 (utils/exercises/nb08.py): run main(out), note what each rank did ---
if __name__ == "__main__":
    from utils.ddp.exercise import run_and_record

    run_and_record(main)
"""
LAUNCH_TIMEOUT_S = 90
"""A launch that runs longer waits for a collective that one rank never reaches (a correct one takes seconds)."""
BLANKS = 6
"""The stub's ✏️ lines, each ``...`` until the learner fills it."""
NOT_SHUFFLED = "shuffled (DistributedSampler's default, `shuffle=True`)"


def _blanks(tree: ast.AST) -> list[ast.AST]:
    """The stub's ``...`` lines still in the program: a bare ``...`` or ``name = ...``."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.Expr, ast.Assign))
        and isinstance(node.value, ast.Constant)
        and node.value.value is Ellipsis
    ]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == name or getattr(node.func, "id", None) == name)
    ]


def _in_finally(tree: ast.AST, call: ast.Call) -> bool:
    return any(
        isinstance(node, ast.Try) and any(call in ast.walk(stmt) for stmt in node.finalbody) for node in ast.walk(tree)
    )


def _program_checks(fn, source: str) -> None:
    """What the program's text shows before it runs: untouched, blanks left, the course's helper, no finally."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        hint(f"the cell is not valid Python (line {err.lineno}: {err.msg})")
    main = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn.__name__), None)
    blanks = _blanks(main if main is not None else tree)
    if len(blanks) >= BLANKS:
        raise NotAttempted(
            "Replace each `...` marked ✏️ in the cell above with a line of code, run that cell, then this one."
        )
    for node in blanks:
        if isinstance(node, ast.Assign):
            name = ast.unparse(node.targets[0])
            hint(
                f"`{name}` is still `...` (line {node.lineno} of the cell): "
                + {
                    "ddp": "it is the model, wrapped as section 3's program wraps it (for a CPU model)",
                    "sampler": "it gives the DataLoader this rank's shard of the dataset, as in section 3's program",
                }.get(name, "replace the `...` with your code")
            )
    if refers_to(fn, "common.distributed"):
        hint(
            "`main` uses the course's helper `distributed()`, which hides `init_process_group` and "
            "`destroy_process_group`: this exercise is about writing those two lines yourself, as section 3's "
            "program does"
        )
    for call in _calls(tree, "destroy_process_group"):
        if not _in_finally(tree, call):
            hint(
                f"`destroy_process_group()` (line {call.lineno}) runs only when training succeeds: put it in the "
                "`finally:` block, so that a rank that fails still leaves the group and its peers get an error "
                "instead of waiting for it"
            )


_FAILURES = [  # (pattern in the failed launch's output, hint)
    (
        r"Default process group has not been initialized",
        "the program used the process group before joining it: `dist.get_rank()` needs "
        '`dist.init_process_group("gloo")` first (torchrun set the RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT it '
        "reads)",
    ),
    (
        r"mutually exclusive with shuffle|sampler option is mutually exclusive",
        "`DataLoader(..., shuffle=True)` together with a sampler is refused: the `DistributedSampler` shuffles "
        "(the same permutation on every rank), the DataLoader must not",
    ),
    (
        r"device_ids and output_device arguments only work with",
        "`device_ids` is for a model on a GPU: a CPU model is wrapped with `DDP(model)`, no `device_ids`",
    ),
    (
        r"ProcessGroupNCCL|NCCL is not available|nccl.*(GPU|CUDA)",
        'this program runs on the CPU, where the backend is gloo: `dist.init_process_group("gloo")` (NCCL needs a '
        "GPU for every process)",
    ),
    (
        r"Connection closed by peer|Connection reset by peer",
        "a rank waited in a collective that the other rank never ran: it had already left the group. Every rank "
        "must run the same collectives, so a `dist.barrier()` (or any collective) goes outside `if rank == 0:`",
    ),
    (
        r"NameError: name '\w+' is not defined",
        "a name the program uses is not defined in it: the workers run only this cell (written to "
        "`runs/ex4_ddp.py`), not the notebook's other cells, so the cell must import everything it uses",
    ),
    (
        r"trying to initialize the default process group twice",
        "`init_process_group` ran twice in one process: join the group once, at the start of `main`",
    ),
]
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]: )?(\w+(?:Error|Exception)): (.*)$", re.M)


def _launch_failed(err) -> None:
    text = str(err)
    if err.result.timed_out:
        hint(
            f"the program ran longer than {LAUNCH_TIMEOUT_S} s (it takes seconds): a rank is waiting in a collective "
            "that the other never reaches, such as a `dist.barrier()` that only rank 0 runs"
        )
    for pattern, advice in _FAILURES:
        if re.search(pattern, text):
            hint(advice)
    found = _ERROR_LINE.findall(text)
    said = f"{found[-1][0]}: {found[-1][1][:200]}" if found else text.strip().splitlines()[0][:200]
    hint(f"the program failed on 2 processes ({said})")


def _launch(source: str, tmp: Path) -> tuple[dict[int, dict], Path, float]:
    """Write the program to runs/ex4_ddp.py, run it on 2 processes; each rank's record, the folder it saved to."""
    from utils.launch import TorchrunError, run_torchrun

    program = rules.write_program(PROGRAM_FILE, source.rstrip() + "\n" + FOOTER)
    out, record = tmp / "out", tmp / "record"
    out.mkdir()
    record.mkdir()
    try:
        result = run_torchrun(
            program,
            nproc=2,
            args=["--out", str(out), "--record", str(record)],
            timeout=LAUNCH_TIMEOUT_S,
            env={"CUDA_VISIBLE_DEVICES": ""},  # gloo on the CPU, whatever the machine has
        )
    except TorchrunError as err:
        _launch_failed(err)
    records = {}
    for r in (0, 1):
        f = record / f"rank{r}.json"
        expect(f.exists(), f"rank {r} ended without returning from `main`")
        records[r] = json.loads(f.read_text(encoding="utf-8"))
    return records, out, result.wall_s


def _train_one_process(epochs: list[list[int]], ranks: tuple[int, ...] = (0, 1)) -> dict[str, torch.Tensor]:
    """One process walking each epoch's order in batches of 8 per rank, the ranks' batches together (Proof (1))."""
    from utils.ddp.exercise import BATCH_SIZE, LR, MOMENTUM, SEED, ToyModel, make_data

    x, y = make_data()
    torch.manual_seed(SEED)  # rank 0's initial model, which DDP's constructor broadcast
    model = ToyModel()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with torch.enable_grad():  # whatever grad mode the learner's kernel is in
        for order in epochs:
            shards = [order[r::2] for r in ranks]
            for s in range(0, len(shards[0]), BATCH_SIZE):
                rows = [i for shard in shards for i in shard[s : s + BATCH_SIZE]]
                loss = F.mse_loss(model(x[rows]), y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _check_shards(records: dict[int, dict], orders: list[list[int]]) -> None:
    from utils.ddp.exercise import EPOCHS, SAMPLES

    per_epoch = SAMPLES // 2
    read = {r: rec["read"] for r, rec in records.items()}
    if any(len(v) == EPOCHS * SAMPLES for v in read.values()):
        hint(
            "each rank read all 64 samples in every epoch: without a `DistributedSampler` in the DataLoader "
            "(`sampler=sampler`) both ranks train on the same batches, so two processes do the work of one"
        )
    for r, v in read.items():
        expect(
            len(v) == EPOCHS * per_epoch,
            f"rank {r} read {len(v)} samples in {EPOCHS} epochs; its shard is 32 of the 64 samples per epoch",
        )
    epochs = {r: [v[e * per_epoch : (e + 1) * per_epoch] for e in range(EPOCHS)] for r, v in read.items()}
    if set(epochs[0][0]) & set(epochs[1][0]):
        hint(
            "the two ranks' shards overlap in epoch 0: each rank must take its own part of the order (the sampler "
            "reads the rank from the process group, or give it `rank=dist.get_rank()`)"
        )
    if epochs[0][0] == list(range(0, SAMPLES, 2)):
        hint(f"the shards are in the dataset's order: the exercise asks for them {NOT_SHUFFLED}")
    if all(epochs[r][0] == epochs[r][e] for r in (0, 1) for e in range(EPOCHS)):
        hint(
            "every epoch gave each rank the same samples in the same order: call `sampler.set_epoch(epoch)` before "
            "each epoch; the sampler's shuffle is seeded with seed + epoch, and without it every epoch repeats "
            "epoch 0's"
        )
    for r, rec in records.items():
        if not rec["sampled"]:
            hint(
                f"rank {r} read its shard without a `DistributedSampler`: the exercise asks for the sampler, which "
                "reads the rank and the world size from the process group and pads the order to equal lengths, so "
                "the same program runs on any number of processes; an index list of your own hard-codes them "
                "(section 3's program)"
            )
        expect(
            rec["sampled"] == rec["read"],
            f"rank {r} read other samples than its `DistributedSampler` gave out: the DataLoader must draw its "
            "indices from the sampler (`sampler=sampler`), and nothing else should iterate it",
        )
    for r in (0, 1):
        for e in range(EPOCHS):
            expect(
                epochs[r][e] == orders[e][r::2],
                f"rank {r}'s shard of epoch {e} is not `DistributedSampler(dataset)`'s after `set_epoch({e})` "
                "(seed 0, shuffled): leave the sampler's seed at its default and call `set_epoch(epoch)` with the "
                "loop's epoch",
            )


def _check_saved(records: dict[int, dict], out: Path, source: str) -> dict[str, torch.Tensor]:
    from utils.ddp.exercise import SAVED_NAME

    if records[1]["saves"] and re.search(r"local_rank", source, re.I):
        hint(
            "both ranks saved: the check runs them as a job on 2 machines, one process each, where both have "
            "LOCAL_RANK 0. Local ranks repeat on every machine, so a condition on LOCAL_RANK lets one process per "
            "machine write the file; the global rank (`dist.get_rank()`, RANK) names one process in the whole job",
            RANKS,
        )
    if records[1]["saves"]:
        hint(
            "rank 1 saved too: the parameters are equal on every rank, so one writer is enough, and several "
            "processes writing one file at once can leave it half-written; save inside `if rank == 0:`"
        )
    expect(
        records[0]["saves"], f"nothing was saved: rank 0 should `torch.save(model.state_dict(), out / {SAVED_NAME!r})`"
    )
    if len(records[0]["saves"]) > 1:
        hint(
            f"rank 0 called `torch.save` {len(records[0]['saves'])} times: the task asks for the trained model, "
            "one file written once, after the last epoch. Every write serialises the whole model, and a file "
            "rewritten while training goes on holds a half-trained model until the last write (a checkpoint to "
            "resume from, as section 3's program writes each epoch, is another thing: it also holds the "
            "optimizer's state)"
        )
    files = sorted(p.name for p in out.iterdir())
    expect(
        files == [SAVED_NAME],
        f"the program left {files or 'no file'} in `out`; expected one file, {SAVED_NAME!r}",
    )
    try:
        state = torch.load(out / SAVED_NAME, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a learner's file that is not a state_dict
        hint(
            f"`torch.load(..., weights_only=True)` refuses the saved file ({type(err).__name__}): save "
            "`model.state_dict()`, a dict of tensors, not the model object (notebook 06)"
        )
    expect(isinstance(state, dict), f"the saved file holds {type(state).__name__}: save `model.state_dict()`")
    if any(str(k).startswith("module.") for k in state):
        hint(
            "the saved keys start with `module.` (the wrapper's state_dict): save the unwrapped "
            "`model.state_dict()` (or `ddp.module.state_dict()`), which loads into a plain `ToyModel`",
            "1. `nn.DataParallel`: one process, many GPUs",
        )
    return state


@EXERCISES.exercise(4, "A DDP program, launched on 2 processes (write a program)", PROGRAM)
def ddp_program_check(main):
    source = rules.cell_source(main=main)
    _program_checks(main, source)
    with tempfile.TemporaryDirectory(prefix="ex4-") as tmp:
        records, out, wall = _launch(source, Path(tmp))
        for r, rec in records.items():
            if not rec["ddp"]:
                hint(
                    f"rank {r} built no `DistributedDataParallel`: without the wrapper nothing averages the "
                    "gradients between the ranks, and each rank trains a model of its own; the exercise is a DDP "
                    "program, as in section 3"
                )
            if not rec["forwards"]:
                hint(
                    f"rank {r} never ran a forward through the DDP wrapper: DDP synchronises the backward only of a "
                    "forward that went through `ddp(x)`, not `model(x)`"
                )
        orders = [
            torch.randperm(64, generator=torch.Generator().manual_seed(0 + e)).tolist() for e in range(3)
        ]  # DistributedSampler(shuffle=True, seed=0) after set_epoch(e): the same order on every rank
        _check_shards(records, orders)
        state = _check_saved(records, out, source)
        if not records[0]["left the group"] or not records[1]["left the group"]:
            hint(
                "`main` returned without `dist.destroy_process_group()`: a program leaves its process group "
                "(in the `finally:` block, so that it also does after an error), or its sockets and threads "
                "outlive the training"
            )
        want = _train_one_process(orders)
        expect(
            sorted(state) == sorted(want),
            f"the saved keys are {sorted(state)}, a `ToyModel`'s are {sorted(want)}: save `model.state_dict()`",
        )
        worst = max((state[k].double() - want[k].double()).abs().max().item() for k in want)
        if worst > 1e-5:
            alone = _train_one_process(orders, ranks=(0,))
            if max((state[k] - alone[k]).abs().max().item() for k in want) < 1e-5:
                hint(
                    "rank 0 saved what it learned from its own shard alone: the gradients were not averaged over "
                    "the ranks (train through the DDP wrapper, `ddp(x)`)"
                )
            hint(
                f"rank 0's saved model differs from one process trained with batch 16 on the same orders by up to "
                f"{worst:.2g}: keep the given loop (batch 8 per rank, SGD lr 0.05, momentum 0.9, 3 epochs, "
                "`torch.manual_seed(rank)` before building the model)"
            )
    return (
        f"`torchrun --standalone --nproc_per_node=2 runs/{PROGRAM_FILE}` ran in {wall:.0f} s: the two ranks read "
        "disjoint shards from their `DistributedSampler`, a new shuffle each epoch; rank 0 alone saved, once, and "
        f"its model equals one process's trained with batch 16 (largest difference {worst:.0e})"
    )
