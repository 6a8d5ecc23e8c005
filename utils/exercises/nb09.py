"""Checks for the exercises of notebook 09 · sharding and distributed checkpoints
(``notebooks/src/09_sharding_and_distributed_checkpoints.py``).
Used by notebook 09, whose ``Checker("09")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.

Nothing here starts a process or a process group: FSDP2's dim-0 sharding and a checkpoint's resharding are
checked as tensor code, against ``torch.chunk`` (the rule ``fully_shard`` and ``Shard(0)`` follow).
"""

import math

import torch

from utils.exercises import Registry, expect, hint, number_answer, returns

EXERCISES = Registry("09")

ZERO = "1. ZeRO and FSDP2: shard everything, gather just in time"
DCP = "2. Distributed checkpoints: every rank writes its shard, any world size reads"
STATE_DICT = "06 · 5. A training checkpoint"


@EXERCISES.exercise(1, "Bytes per rank under ZeRO-1/2/3, and ZeRO-3's traffic (predict)", ZERO)
def zero_memory(ddp_gb, zero1_gb, zero2_gb, zero3_gb, zero3_traffic):
    names = ("ddp_gb", "zero1_gb", "zero2_gb", "zero3_gb")
    got = [number_answer(v, n) for v, n in zip((ddp_gb, zero1_gb, zero2_gb, zero3_gb), names)]
    want = [32, 18, 11, 4]  # 2e9 parameters, float32 Adam: 4 + 4 + 8 bytes each, 8 ranks
    if all(math.isclose(g, w * 1e9 / 2**30, rel_tol=1e-3) for g, w in zip(got, want)):
        hint("these are GiB (2**30 bytes); the ZeRO table (and this exercise) counts GB, 10**9 bytes")
    if math.isclose(got[1], 11) and math.isclose(got[2], 7.5):
        hint(
            "those are the mixed-precision counts (2 + 2 + 12 bytes, the paper's K = 12); this model trains in "
            "float32 with Adam: 4 + 4 + 8 bytes per parameter"
        )
    if math.isclose(got[0], 24):
        hint(
            "ddp_gb: Adam keeps two float32 states per parameter (exp_avg and exp_avg_sq), 8 bytes, besides "
            "the 4-byte weight and the 4-byte gradient"
        )
    expect(
        math.isclose(got[0], 32),
        f"ddp_gb = {got[0]}: DDP keeps weights, gradients and Adam's two states whole "
        "on every rank, 16 bytes per parameter",
    )
    if math.isclose(got[1], 4):
        hint("zero1_gb: ZeRO-1 shards only the optimizer states; weights and gradients stay whole on every rank")
    expect(math.isclose(got[1], 18), f"zero1_gb = {got[1]}: ZeRO-1 keeps 4Ψ + 4Ψ whole and 8Ψ / N of Adam's states")
    if math.isclose(got[2], 18):
        hint("zero2_gb: ZeRO-2 shards the gradients too, not only the optimizer states")
    expect(
        math.isclose(got[2], 11),
        f"zero2_gb = {got[2]}: ZeRO-2 keeps the weights whole (4Ψ) and shards "
        "gradients and Adam's states ((4 + 8)Ψ / N)",
    )
    expect(math.isclose(got[3], 4), f"zero3_gb = {got[3]}: ZeRO-3 shards everything, 16Ψ / N")
    traffic = number_answer(zero3_traffic, "zero3_traffic")
    if math.isclose(traffic, 2):
        hint(
            "zero3_traffic: 2Ψ is DDP's all-reduce; ZeRO-3 all-gathers the parameters twice (for forward, and "
            "again for backward, since the forward freed them) and reduce-scatters the gradients once"
        )
    if math.isclose(traffic, 1.5):
        hint("zero3_traffic: 1.5 is the ratio to DDP; give ZeRO-3's traffic itself, in units of Ψ")
    expect(
        math.isclose(traffic, 3),
        f"zero3_traffic = {traffic}: count the all-gathers and reduce-scatters of one "
        "step, each moving one model's worth (Ψ)",
    )


def _chunk_rows(t: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """Shard(0) as fully_shard cuts it: torch.chunk, then empty pieces (0, *rest) for the ranks left over."""
    pieces = list(torch.chunk(t, world_size))
    return pieces + [t[:0]] * (world_size - len(pieces))


def _padded(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    rows = -(-t.shape[0] // world_size)
    mine = _chunk_rows(t, world_size)[rank]
    return torch.cat([mine, t.new_zeros(rows - len(mine), *t.shape[1:])])


def _chunk_hint(rows: int, world_size: int, rank: int) -> str:
    pieces = len(torch.chunk(torch.empty(rows), world_size))
    size = -(-rows // world_size)
    return (
        f"{rows} rows on {world_size} ranks: rank {rank} raised IndexError. torch.chunk cuts pieces of "
        f"ceil({rows} / {world_size}) = {size} rows and so returns only {pieces} pieces; a rank left without a "
        "piece has no real row, but still stores a shard of padding"
    )


@EXERCISES.exercise(2, "FSDP2's padded dim-0 shard (write a function)", ZERO)
def fsdp_shard_check(fn):
    param = torch.arange(15.0).reshape(5, 3)  # 5 rows on 4 ranks: 2 + 2 + 1 + 0
    for rank in range(4):
        try:
            out = returns(fn, param, rank, 4)
        except IndexError:
            hint(_chunk_hint(5, 4, rank))
        expect(isinstance(out, torch.Tensor), f"return a tensor, not a {type(out).__name__}")
        real = _chunk_rows(param, 4)[rank]
        if tuple(out.shape) == tuple(real.shape) and rank >= 2:
            hint(
                f"rank {rank} returned its {len(real)} real row(s) of shape {tuple(out.shape)}; every rank stores "
                "ceil(5 / 4) = 2 rows, zeros after the real ones, so that the all-gather moves equal pieces"
            )
        expect(
            tuple(out.shape) == (2, 3),
            f"rank {rank}: the padded shard of a (5, 3) parameter on 4 ranks has shape "
            f"(2, 3), ceil(5 / 4) rows, not {tuple(out.shape)}",
        )
        expect(out.dtype == param.dtype, f"keep the parameter's dtype: got {out.dtype}, expected {param.dtype}")
        split = list(torch.tensor_split(param, 4))[rank]
        if rank == 1 and torch.equal(out[: len(split)], split) and not torch.equal(out, _padded(param, 1, 4)):
            hint(
                "that is torch.tensor_split's cut (2 + 1 + 1 + 1 rows); FSDP2 cuts like torch.chunk: pieces of "
                "ceil(5 / 4) = 2 rows, 2 + 2 + 1 + 0, so that after the all-gather all the padding is at the end"
            )
        if len(real) and torch.equal(out[-len(real) :], real) and not torch.equal(out[: len(real)], real):
            hint(f"rank {rank}: put the real rows first and the zero padding after them")
        expect(
            torch.equal(out[: len(real)], real),
            f"rank {rank}: its real rows should be rows "
            f"{2 * rank}..{2 * rank + len(real) - 1} of the parameter, got {out.tolist()}",
        )
        expect(
            torch.equal(out[len(real) :], torch.zeros_like(out[len(real) :])),
            f"rank {rank}: pad with zeros (FSDP2 "
            f"pads with new_zeros; fresh `empty` memory holds garbage), got {out.tolist()}",
        )
    g = torch.Generator().manual_seed(9)
    for shape in ((3,), (7, 2), (4, 3, 2), (2, 5), (8, 1)):
        for world_size in (1, 2, 3, 4, 5):
            t = torch.randn(shape, generator=g, dtype=torch.float64)
            for rank in range(world_size):
                try:
                    out = returns(fn, t, rank, world_size)
                except IndexError:
                    hint(_chunk_hint(shape[0], world_size, rank))
                want = _padded(t, rank, world_size)
                where = f"a {tuple(shape)} float64 parameter on {world_size} rank{'s' * (world_size > 1)}, rank {rank}"
                expect(isinstance(out, torch.Tensor), f"{where}: return a tensor, not a {type(out).__name__}")
                expect(
                    out.dtype == t.dtype,
                    f"{where}: the shard is {out.dtype}; keep the parameter's dtype "
                    "(`torch.zeros(...)` without dtype= makes float32: use `param.new_zeros(...)`)",
                )
                expect(
                    tuple(out.shape) == tuple(want.shape) and torch.equal(out, want),
                    f"{where}: expected shape "
                    f"{tuple(want.shape)} {want.tolist()}, got {tuple(out.shape)} {out.tolist()}",
                )
            gathered = torch.cat([fn(t, r, world_size) for r in range(world_size)])  # what all-gather returns
            assert torch.equal(gathered[: shape[0]], t)  # follows from the checks above: padding only at the end
    return (
        "all-gathering the padded shards and keeping the first rows gives the parameter back: with "
        "torch.chunk's cut, all the padding lands at the end"
    )


def _checkpoint(g: torch.Generator) -> dict[str, torch.Tensor]:
    """The full state of notebook 09's MLP with part of Adam's state, keyed like its distributed checkpoint."""
    full = {
        "model.0.weight": torch.randn(8, 6, generator=g),
        "model.0.bias": torch.randn(8, generator=g),
        "model.2.weight": torch.randn(3, 8, generator=g),
        "model.2.bias": torch.randn(3, generator=g),
    }
    full["optim.state.2.weight.exp_avg"] = torch.randn(3, 8, generator=g)
    full["optim.state.2.weight.step"] = torch.tensor(3.0)  # Adam's step: 0-dim, replicated on every rank
    return full


def _shards(full: dict[str, torch.Tensor], world_size: int) -> list[dict[str, torch.Tensor]]:
    return [
        {k: (_chunk_rows(v, world_size)[r].clone() if v.dim() else v.clone()) for k, v in full.items()}
        for r in range(world_size)
    ]


@EXERCISES.exercise(3, "Reshard a checkpoint saved by 2 ranks onto 3 (stretch)", DCP)
def reshard_check(fn):
    g = torch.Generator().manual_seed(10)
    for old, new in ((2, 3), (2, 1), (4, 2), (2, 5), (3, 3)):
        full = _checkpoint(g)
        shards = _shards(full, old)
        try:
            out = returns(fn, shards, new)
        except IndexError:
            hint(
                f"{old} → {new} ranks raised IndexError: torch.chunk cuts a 3-row tensor on {new} ranks into only "
                f"{len(torch.chunk(torch.empty(3), new))} pieces; the ranks left over get an empty shard",
                ZERO,
            )
        except RuntimeError as err:
            if "zero-dimensional tensor" in str(err):
                hint(
                    "`optim.state.2.weight.step` is a 0-dim tensor that every rank holds whole (replicated, like "
                    "Adam's step), not a shard: copy it, do not concatenate it",
                    STATE_DICT,
                )
            raise
        expect(
            isinstance(out, (list, tuple)) and all(isinstance(d, dict) for d in out),
            f"return a list of dicts, one state dict per new rank, not {type(out).__name__}",
        )
        expect(len(out) == new, f"{old} → {new} ranks: return {new} state dicts, one per new rank, not {len(out)}")
        for r, d in enumerate(out):
            expect(
                set(d) == set(full),
                f"{old} → {new} ranks, rank {r}: the keys should be those of the checkpoint; "
                f"missing {sorted(set(full) - set(d))}, extra {sorted(set(d) - set(full))}",
                STATE_DICT,
            )
            for k, v in full.items():
                want = _chunk_rows(v, new)[r] if v.dim() else v
                got = d[k]
                expect(isinstance(got, torch.Tensor), f"{k} on rank {r}: a tensor, not {type(got).__name__}")
                if v.dim() == 0:
                    expect(
                        got.dim() == 0 and torch.equal(got, v),
                        f"{k} is replicated: every rank keeps the same 0-dim tensor {v}, got {got}",
                        STATE_DICT,
                    )
                    continue
                if want.numel() == 0 and got.numel() == 0 and tuple(got.shape) != tuple(want.shape):
                    hint(
                        f"`{k}` on rank {r}: an empty shard keeps the other dimensions, shape {tuple(want.shape)} "
                        f"like `t[:0]` (what `to_local()` returns), not {tuple(got.shape)}"
                    )
                size = -(-v.shape[0] // new)
                if tuple(got.shape) == (size, *v.shape[1:]) != tuple(want.shape):
                    hint(
                        f"`{k}` on rank {r} has {size} rows: that is the padded shard FSDP2 keeps in memory (exercise "
                        "2); the checkpoint holds the unpadded pieces, what `to_local()` returns: the last ranks get "
                        "fewer rows or none",
                        ZERO,
                    )
                split = list(torch.tensor_split(v, new))[r]
                if tuple(got.shape) == tuple(split.shape) != tuple(want.shape):
                    hint(
                        f"`{k}` on {new} ranks: that is torch.tensor_split's cut; Shard(0) cuts like torch.chunk, "
                        f"pieces of ceil({v.shape[0]} / {new}) = {size} rows, so the last ranks get fewer or none",
                        ZERO,
                    )
                if tuple(got.shape) == (v.shape[0] // new, *v.shape[1:]) != tuple(want.shape):
                    hint(
                        f"`{k}`: {v.shape[0]} // {new} = {v.shape[0] // new} rows per rank rounds down and loses "
                        f"rows; torch.chunk's pieces have ceil({v.shape[0]} / {new}) = {size} rows",
                        ZERO,
                    )
                expect(
                    tuple(got.shape) == tuple(want.shape) and torch.equal(got, want),
                    f"{old} → {new} ranks, {k} on rank {r}: expected shape {tuple(want.shape)} (rows "
                    f"{r * -(-v.shape[0] // new)}.. of the full tensor, cut like torch.chunk), got "
                    f"{tuple(got.shape)}",
                )
    # 2 -> 1 is the notebook's resharding: one full state dict that a plain model loads (notebook 06)
    full = _checkpoint(g)
    single = returns(fn, _shards(full, 2), 1)[0]
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.load_state_dict({k.removeprefix("model."): v for k, v in single.items() if k.startswith("model.")})
    assert torch.equal(model[2].weight, full["model.2.weight"])
    return "and 2 → 1 gives a full state dict whose model.* entries load into a plain nn.Sequential"
