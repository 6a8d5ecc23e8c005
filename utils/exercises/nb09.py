"""Checks for the exercises of notebook 09 · sharding and distributed checkpoints
(``notebooks/src/09_sharding_and_distributed_checkpoints.py``).
Used by notebook 09, whose ``Checker("09")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.

Nothing here starts a process or a process group: FSDP2's dim-0 sharding and a checkpoint's resharding are
checked as tensor code, against ``torch.chunk`` (the rule ``fully_shard`` and ``Shard(0)`` follow).
"""

import ast
import math
import os
import re
from pathlib import Path

import torch

from utils.exercises import NotAttempted, Registry, expect, hint, number_answer, returns, rules

EXERCISES = Registry("09")

ZERO = "1. ZeRO and FSDP2: shard everything, gather just in time"
DCP = "2. Distributed checkpoints: every rank writes its shard, any world size reads"
STATE_DICT = "06 · 5. A training checkpoint"


@EXERCISES.exercise(1, "Bytes per rank under ZeRO-1/2/3, and ZeRO-3's traffic (predict)", ZERO)
def zero_memory(ddp_gb, zero1_gb, zero2_gb, zero3_gb, zero3_traffic):
    names = ("ddp_gb", "zero1_gb", "zero2_gb", "zero3_gb")
    # float(): the number itself, whatever a subclass of int or float says about its comparisons
    got = [float(number_answer(v, n)) for v, n in zip((ddp_gb, zero1_gb, zero2_gb, zero3_gb), names)]
    want = [32, 18, 11, 4]  # 2e9 parameters, float32 Adam: 4 + 4 + 8 bytes each, 8 ranks
    for name, g in zip(names, got):
        if g >= 1e6:
            hint(f"{name} = {g:g} looks like bytes; give GB, 10**9 bytes (5·10⁹ bytes is 5 GB)")
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
    traffic = float(number_answer(zero3_traffic, "zero3_traffic"))
    if math.isclose(traffic, 2):
        hint(
            "zero3_traffic: 2Ψ is DDP's all-reduce; ZeRO-3 frees each layer's parameters after using them: count "
            "the collectives of one step, in forward and in backward, each moving Ψ"
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


LIBRARY_CUTS = (
    "_split_tensor",
    "_split_tensor_helper",
    "_custom_chunk",
    "pad_tensor",
    "distribute_tensor",
    "Shard",
    "_chunk_with_empty",
    "_get_dim0_padded_size",
)
"""DTensor's and FSDP2's own sharding code (``Shard(0)._split_tensor(t, n)`` returns the padded pieces, FSDP2's private
``_chunk_with_empty`` the pieces and ``_get_dim0_padded_size`` their padded size): what exercises 2 and 4 ask the
learner to write. Any other name from ``torch.distributed`` is refused too: the cut needs tensor operations only."""


def _own_cut(fn, name: str) -> None:
    used = rules.refers_to(fn, *LIBRARY_CUTS)
    used = used or min((n for n in rules.names_used(fn) if n.startswith("torch.distributed.")), default=None)
    if used:
        hint(
            f"`{name}` uses DTensor's or FSDP2's own sharding code (`{used}`): that is the cut this exercise asks you "
            "to write with tensor operations, to see for yourself where each rank's rows and the padding go",
            ZERO,
        )


def _own_memory(out: torch.Tensor, param: torch.Tensor, where: str) -> None:
    if out.numel() and out.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
        hint(
            f"{where}: the shard is a view of `param`, sharing its memory, so the whole parameter stays alive on "
            "every rank and sharding saves nothing; a rank stores its rows in memory of its own (FSDP2 copies "
            "them into a new padded buffer, then frees the full parameter)",
            ZERO,
        )


@EXERCISES.exercise(2, "FSDP2's padded dim-0 shard (write a function)", ZERO)
def fsdp_shard_check(fn):
    _own_cut(fn, "fsdp_shard")
    param = torch.arange(15.0).reshape(5, 3)  # 5 rows on 4 ranks: 2 + 2 + 1 + 0
    shards = []
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
        shards.append(out)
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
    for rank, out in enumerate(shards):  # after the rows' hints: a view is right in every value
        _own_memory(out, param, f"rank {rank}")
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
                _own_memory(out, t, where)
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


@EXERCISES.exercise(4, "Reshard a checkpoint saved by 2 ranks onto 3 (stretch)", DCP)
def reshard_check(fn):
    _own_cut(fn, "reshard")
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
            missing = sorted(set(full) - set(d))
            if missing and all(full[k].dim() and len(torch.chunk(full[k], new)) <= r for k in missing):
                rows = full[missing[0]].shape[0]
                hint(
                    f"{old} → {new} ranks: rank {r} got no `{missing[0]}`. torch.chunk cuts its {rows} rows into "
                    f"pieces of ceil({rows} / {new}) = {-(-rows // new)} rows: only "
                    f"{len(torch.chunk(full[missing[0]], new))} pieces for {new} ranks, so a loop over the pieces "
                    f"never reaches rank {r}. Every rank needs every key; the ranks left over hold an empty shard",
                    ZERO,
                )
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
    loaded = "and 2 → 1 gives a full state dict whose model.* entries load into a plain nn.Sequential"
    full = _checkpoint(g)
    if built := _full_tensor_built(fn, _shards(full, 4), 2, full):
        return (
            f"{loaded}. It builds the whole `{built}` in one process (4 → 2), which DCP never does: for more, copy "
            "into each new shard only the rows of the old shards that overlap it (the task's last paragraph)"
        )
    return f"{loaded}, and no rank's work needed a whole tensor: DCP's way"


def _full_tensor_built(fn, shards: list[dict], world_size: int, full: dict[str, torch.Tensor]) -> str | None:
    """The first key whose whole tensor a torch function returned while ``fn`` resharded ``shards``."""
    from torch.overrides import TorchFunctionMode

    found: list[str] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not found and isinstance(out, torch.Tensor) and out.dim():
                found.extend(k for k, v in full.items() if v.dim() and v.shape == out.shape and torch.equal(v, out))
            return out

    with Watch():
        fn(shards, world_size)
    return found[0] if found else None


# --- Exercise 3: the learner's cell, run as a program on 2 processes, then on 1 -------------------------------------

PROGRAM = "09_exercise3.py"
"""The program the check writes into ``notebooks/runs/``: a header, the learner's cell, and :data:`_FOOTER`."""
_HEADER = '''\
"""Notebook 09, exercise 3, as its check wrote it: your exercise cell between two lines of the check's own.
By hand, in notebooks/: torchrun --standalone --nproc_per_node=2 runs/09_exercise3.py --ckpt CKPT --out OUT
"""
import torch
import torch.nn as nn

# ---- your exercise cell ----
'''
_FOOTER = """
# ---- the check (utils/exercises/nb09.py): build, shard, train, save, load, on every rank ----
from utils.exercises.nb09 import run_exercise_3  # noqa: E402

run_exercise_3(shard, save, load, cell_lines=({first}, {last}))
"""
UNITS = ("", "0", "2", "4")  # the root and each Linear of exercise_3_model
OTHER_UNITS = ("", "0", "1", "3")  # the root and each Linear of _other_model: a `shard` that counts positions fails
_SHIFT = 1.0
"""Added to every weight after ``save`` returns, before the check writes its own checkpoint for ``load`` to read: values
that ``load`` did not read from the folder it was given differ from the expected ones."""
_KEPT = -7.0
"""What the trained model's weights hold while ``load`` runs: a ``load`` that copies from that model returns these."""
_LAYERS = {"0.weight": (7, 5), "0.bias": (7,), "2.weight": (4, 7), "2.bias": (4,), "4.weight": (3, 4), "4.bias": (3,)}


def exercise_3_model() -> torch.nn.Module:
    """The model exercise 3's check builds, shards, trains, saves and loads: three Linear layers."""
    nn = torch.nn
    torch.manual_seed(0)  # the same weights on every rank and in the reference
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 4), nn.ReLU(), nn.Linear(4, 3))


def _other_model() -> torch.nn.Module:
    """A second model for ``shard`` alone, its three Linear layers at other positions than exercise_3_model's."""
    nn = torch.nn
    return nn.Sequential(nn.Linear(5, 6), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))


def _param_facts(model: torch.nn.Module) -> dict[str, tuple]:
    from torch.distributed.tensor import DTensor

    facts = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            placements = tuple(repr(q) for q in p.placements)
            facts[name] = ("DTensor", placements, p.device_mesh.size(), tuple(p.to_local().shape), tuple(p.shape))
        else:
            facts[name] = (type(p).__name__, (), 0, tuple(p.shape), tuple(p.shape))
    return facts


def _learner_error(name: str, exc: BaseException, program: str, cell_lines: tuple[int, int]) -> dict:
    import traceback

    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == program and cell_lines[0] <= frame.lineno <= cell_lines[1]:
            where = f" in `{frame.name}` (line {frame.lineno - cell_lines[0] + 1} of its cell)"
            break
    lines = str(exc).strip().splitlines()
    return {"function": name, "type": type(exc).__name__, "message": lines[0][:300] if lines else "", "where": where}


class _RecordingLoad:
    """``dcp.load`` that notes, per call, how each requested tensor is held: a DTensor (this rank's rows) or whole."""

    def __init__(self, original):
        self.original, self.calls = original, []

    def __call__(self, state_dict, *args, **kwargs):
        from torch.distributed.tensor import DTensor

        seen = {}

        def walk(prefix, value):
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            elif isinstance(value, DTensor):
                seen[prefix] = ("DTensor", tuple(value.to_local().shape), tuple(value.shape))
            elif isinstance(value, torch.Tensor):
                seen[prefix] = ("Tensor", tuple(value.shape), tuple(value.shape))

        walk("", state_dict)
        self.calls.append(seen)
        return self.original(state_dict, *args, **kwargs)


def run_exercise_3(shard, save, load, cell_lines: tuple[int, int]) -> None:
    """The check's side of exercise 3, on every rank of ``runs/09_exercise3.py``: call the learner's functions and
    write what happened (facts, not verdicts: the notebook's check judges them) with ``save_result``."""
    import argparse
    import sys
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_loader as loader
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from utils.ddp.common import distributed, save_result

    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    program = os.path.abspath(sys.argv[0])
    warnings.filterwarnings("ignore")  # the learner's program may warn; the check reads no warning

    def failed(name: str, exc: BaseException) -> None:
        save_result(args.out, {"error": _learner_error(name, exc, program, cell_lines)})
        sys.stdout.flush()
        os._exit(3)  # torchrun stops the other ranks, which may wait in a collective for this one

    facts: dict = {}
    with distributed(prefer="cpu", timeout_s=30) as info:  # gloo on the CPU on every machine: the same check
        mesh = init_device_mesh("cpu", (info.world_size,))
        facts["world_size"] = info.world_size
        model, reference = exercise_3_model(), exercise_3_model()
        try:
            shard(model, mesh)
        except Exception as exc:  # noqa: BLE001 - reported to the notebook
            failed("shard", exc)
        facts["params"] = _param_facts(model)
        facts["units"] = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
        other = _other_model()
        try:
            shard(other, mesh)
            facts["other_units"] = [name for name, m in other.named_modules() if isinstance(m, FSDPModule)]
        except Exception as exc:  # noqa: BLE001
            facts["other_error"] = _learner_error("shard", exc, program, cell_lines)
        del other
        if not all(f[0] == "DTensor" for f in facts["params"].values()):
            save_result(args.out, facts)
            return
        try:
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
            g = torch.Generator().manual_seed(3)
            x, y = torch.randn(12, 5, generator=g), torch.randn(12, 3, generator=g)
            mine = slice(info.rank * 12 // info.world_size, (info.rank + 1) * 12 // info.world_size)
            for step in range(2):
                with CommDebugMode() as comm:
                    F.mse_loss(model(x[mine]), y[mine]).backward()
                if step == 0:
                    facts["counts"] = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
                opt.step()
                opt.zero_grad()
                F.mse_loss(reference(x), y).backward()
                ref_opt.step()
                ref_opt.zero_grad()
            full = {k: v.full_tensor() for k, v in model.state_dict().items()}
            facts["diff"] = max(float((full[k] - v).abs().max()) for k, v in reference.state_dict().items())
            facts["full"] = full
            names = {p: n for n, p in model.named_parameters()}
            facts["exp_avg"] = {names[p]: s["exp_avg"].full_tensor() for p, s in opt.state.items()}
        except Exception as exc:  # noqa: BLE001
            failed("the check's training steps on your sharded model", exc)
        try:
            save(model, opt, args.ckpt)
        except Exception as exc:  # noqa: BLE001
            failed("save", exc)
        dist.barrier()
        facts["files"] = sorted(os.listdir(args.ckpt)) if os.path.isdir(args.ckpt) else None
        if not facts["files"]:
            save_result(args.out, facts)
            return
        # `load` reads the check's own checkpoint of the same layout, written now with every weight shifted; then the
        # trained model's weights are overwritten: only values that `load` reads from its folder can be right
        theirs = f"{args.ckpt}-check"
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().add_(_SHIFT)
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=theirs)
            for p in model.parameters():
                p.to_local().fill_(_KEPT)
        made: list[str] = []
        models: list[torch.nn.Module] = []

        def make_model() -> torch.nn.Module:
            m = exercise_3_model()
            made.append(next(m.parameters()).device.type)
            models.append(m)
            return m

        recording = _RecordingLoad(dcp.load)
        dcp.load = loader.load = recording
        globals_of_load = getattr(load, "__globals__", {})
        rebound = [k for k, v in globals_of_load.items() if v is recording.original]
        for k in rebound:  # `from torch.distributed.checkpoint import load` in the cell
            globals_of_load[k] = recording
        try:
            fresh = load(make_model, theirs, mesh)
        except Exception as exc:  # noqa: BLE001
            failed("load", exc)
        finally:
            dcp.load = loader.load = recording.original
            for k in rebound:
                globals_of_load[k] = recording.original
        facts["made"], facts["reads"] = made, recording.calls
        facts["returned"] = type(fresh).__name__
        facts["built_by_make_model"] = any(fresh is m for m in models)
        if isinstance(fresh, torch.nn.Module):
            facts["loaded_params"] = _param_facts(fresh)
            facts["loaded_units"] = [name for name, m in fresh.named_modules() if isinstance(m, FSDPModule)]
            state = fresh.state_dict()
            facts["loaded"] = {k: v.full_tensor() if isinstance(v, DTensor) else v.detach() for k, v in state.items()}
        save_result(args.out, facts)


def _is_stub(fn) -> bool:
    """A function whose body is still ``raise NotImplementedError(...)`` (after an optional docstring)."""
    tree = rules.syntax(fn)
    if tree is None or not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
        return False
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _static_hints(shard, save, load) -> None:
    """What the functions' source shows before anything runs (quick, and no launch for the common shortcuts)."""
    if used := rules.refers_to(shard, "DistributedDataParallel", "DDP"):
        hint(
            f"`shard` uses {used}: DDP keeps a whole copy of the model on every rank, which is what this notebook "
            "removes; `fully_shard` keeps 1/N of each parameter per rank",
            ZERO,
        )
    if used := rules.refers_to(shard, "FullyShardedDataParallel", "FSDP"):
        hint(
            f"`shard` uses {used}, FSDP1 (one flat parameter per unit, an older API); this notebook's FSDP2 is "
            "`fully_shard`, whose parameters are DTensor shards",
            ZERO,
        )
    for name, fn in (("save", save), ("load", load)):
        if rules.refers_to(fn, "full_tensor"):
            hint(
                f"`{name}` calls `full_tensor()`, which all-gathers the whole tensor onto every rank: a distributed "
                "checkpoint never needs the full model in one place; each rank writes or reads its own shards",
                DCP,
            )
    if rules.refers_to(save, "torch.save"):
        hint(
            "`save` uses torch.save, notebook 06's way: one file of whole tensors from one process; `dcp.save` lets "
            "every rank write its own shards, in parallel",
            DCP,
        )
    if rules.refers_to(load, "torch.load"):
        hint("`load` uses torch.load: the checkpoint is a DCP folder, read with `dcp.load` (in place)", DCP)
    tree = rules.syntax(save)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.If) and "rank" in ast.unparse(node.test).lower():
            hint(
                "`save` saves on some ranks only: `dcp.save` is a collective, every rank writes its own shards (rank 0 "
                "only coordinates the plan and writes .metadata); a rank that does not call it leaves the others "
                "waiting",
                DCP,
            )


_TIMEOUT_S = 90.0
_exercise_3_runs: dict[tuple[str, int], dict] = {}
"""(cell source, processes) -> what that launch reported: checking the same cell again launches nothing."""


def _launch(source: str, nproc: int, work: Path) -> dict:
    """Run the program (written from ``source``) on ``nproc`` processes; what its ranks reported."""
    from utils.launch import load_rank_results, run_torchrun

    if (source, nproc) in _exercise_3_runs:
        return _exercise_3_runs[source, nproc]
    first = _HEADER.count("\n") + 1
    path = rules.write_program(
        PROGRAM, _HEADER + source + _FOOTER.format(first=first, last=first + source.count("\n") - 1)
    )
    ckpt, out = work / "ckpt", work / f"out{nproc}"
    result = run_torchrun(
        path,
        nproc=nproc,
        args=["--ckpt", ckpt, "--out", out],
        timeout=_TIMEOUT_S,
        check=False,
    )
    ranks = load_rank_results(out) if out.is_dir() and any(out.glob("rank*.pt")) else {}
    run = {
        "ranks": ranks,
        "timed_out": result.timed_out,
        "failed": result.returncode != 0 or len(ranks) != nproc,
        "stderr": (result.stderr.strip().splitlines() or ["no message"])[-1][:300],
        "seconds": result.wall_s,
    }
    if nproc == 2 and not run["failed"] and ranks[0].get("files"):
        run["read_here"] = _read_here(ckpt, ranks[0])
    _exercise_3_runs[source, nproc] = run
    return run


def _read_here(ckpt: Path, rank0: dict) -> dict:
    """Read the learner's checkpoint in this process, without a process group (section 2's 2 → 1): which keys and
    chunks it holds, and whether its model and Adam entries are the trained model's."""
    import warnings

    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(ckpt).read_metadata()
    keys = sorted(meta.state_dict_metadata)
    chunks = {
        k: [tuple(c.sizes) for c in md.chunks] for k, md in meta.state_dict_metadata.items() if hasattr(md, "chunks")
    }
    files = {}
    for index, info in meta.storage_data.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    found = {"keys": keys, "chunks": chunks, "files": {k: sorted(v) for k, v in files.items()}}
    wanted = {k: torch.empty(_LAYERS[k[6:]]) for k in keys if k.startswith("model.") and k[6:] in _LAYERS}
    wanted |= {
        k: torch.empty(_LAYERS[k[12:-8]])
        for k in keys
        if k.startswith("optim.state.") and k.endswith(".exp_avg") and k[12:-8] in _LAYERS
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": what section 2 showed
        dcp.load(wanted, checkpoint_id=ckpt)
    found["model_equal"] = {
        k[6:]: torch.equal(v, rank0["full"][k[6:]]) for k, v in wanted.items() if k.startswith("model.")
    }
    found["adam_equal"] = {
        k[12:-8]: torch.equal(v, rank0["exp_avg"][k[12:-8]]) for k, v in wanted.items() if k.startswith("optim.")
    }
    return found


_NAME_ERROR = re.compile(r"name '(\w+)' is not defined")


def _error_hint(error: dict, nproc: int) -> None:
    said = f"{error['type']}{error['where']}: {error['message']}"
    on = f"on {nproc} process{'es' * (nproc > 1)}"
    if error["function"].startswith("the check"):
        hint(f"{on}, {error['function']} raised {said}: is every parameter sharded with `fully_shard`?", ZERO)
    if error["type"] == "NameError" and (m := _NAME_ERROR.search(error["message"])):
        hint(
            f"{on}, `{error['function']}` raised {said}. The program holds only the exercise's cell, after "
            f"`import torch` and `import torch.nn as nn`: import `{m.group(1)}` in that cell (section 1's script "
            "shows the imports)",
            ZERO,
        )
    hint(f"{on}, `{error['function']}` raised {said}", ZERO if error["function"] == "shard" else DCP)


def _judge_shard(rank: dict) -> None:
    params = rank["params"]
    plain = [n for n, f in params.items() if f[0] != "DTensor"]
    if len(plain) == len(params):
        hint(
            "after `shard(model, mesh)` every parameter is still a plain tensor, whole on each rank: `fully_shard("
            "module, mesh=mesh)` replaces a module's parameters by DTensor shards",
            ZERO,
        )
    if plain:
        hint(f"`{plain[0]}` is still a whole tensor on each rank, while other parameters are sharded", ZERO)
    for name, (_, placements, mesh_size, _, _) in params.items():
        expect(
            mesh_size == 2,
            f"`{name}` is sharded over {mesh_size} rank(s): shard on the mesh the check passes (2 ranks)",
            ZERO,
        )
        expect(
            placements == ("Shard(dim=0)",),
            f"`{name}` has placements {placements}: FSDP2 cuts every parameter along dimension 0, `Shard(0)`; keep "
            "fully_shard's default",
            ZERO,
        )
    units = set(rank["units"])
    if units >= {""} and not units & set(UNITS[1:]):
        hint(
            "only the whole model is an FSDP unit: each forward all-gathers every parameter at once, so a rank needs "
            "memory for the full model; make each `nn.Linear` its own unit first (gathered only while it runs), "
            "then the root",
            ZERO,
        )
    if "" not in units:
        hint(
            "the Linear layers are FSDP units but the model itself is not: call `fully_shard` on the whole model "
            "after its layers (the root picks up the parameters left over and starts each step)",
            ZERO,
        )
    if missing := [u for u in UNITS[1:] if u not in units]:
        hint(
            f"{len(missing)} of the 3 `nn.Linear` layers of the model the check passes are not FSDP units of their "
            "own: shard every Linear of the model `shard` gets (find them by their type, not by their position in "
            "section 1's model)",
            ZERO,
        )
    other = rank.get("other_error")
    if other or set(rank.get("other_units", ())) != set(OTHER_UNITS):
        said = (
            f"it raised {other['type']}{other['where']}: {other['message']}"
            if other
            else "it did not make each of its Linear layers an FSDP unit, then the model"
        )
        hint(
            "the check also calls `shard` on a second model of three `nn.Linear` layers, placed differently: "
            f"{said}. Find the layers of the model `shard` gets by their type, not by their position",
            ZERO,
        )


def _judge_training(rank: dict) -> None:
    counts = rank["counts"]
    ag, rs = counts.get("_allgather_base_", 0), counts.get("_reduce_scatter_base_", 0)
    if ag == 3 and rs == 3:
        hint(
            "one training step ran 3 all-gathers, not 6: the layers stayed gathered from forward to backward "
            "(`reshard_after_forward=False`, more memory); keep the default, which frees them after forward",
            ZERO,
        )
    expect(
        (ag, rs) == (6, 3),
        f"one training step of your sharded model ran {ag} all-gathers and {rs} reduce-scatters; with 3 units "
        "(and the root) FSDP2 runs 6 and 3",
        ZERO,
    )
    expect(
        rank["diff"] < 1e-5,
        f"after 2 Adam steps your sharded model differs from the 1-process reference by {rank['diff']:.2g}: shard "
        "in float32, without a mixed-precision policy",
        ZERO,
    )


def _judge_save(rank: dict, here: dict | None) -> None:
    files = rank["files"]
    expect(
        bool(files),
        "`save` wrote nothing into `folder`: give `dcp.save` the folder as its `checkpoint_id`",
        DCP,
    )
    expect(
        here is not None and ".metadata" in files,
        f"`folder` holds {files}, not a distributed checkpoint (a `.metadata` file and one `.distcp` file per "
        "rank): write it with `dcp.save`",
        DCP,
    )
    keys = here["keys"]
    if any(k in keys for k in _LAYERS) or not any(k.startswith("model.") for k in keys):
        hint(
            f'the checkpoint\'s keys are {keys[:4]}...: save `{{"model": ..., "optim": ...}}` as section 2 did, so '
            "that the model's entries are `model.0.weight`, ...",
            DCP,
        )
    if not any(k.startswith("optim.state.") for k in keys):
        hint(
            "the checkpoint has no optimizer state: a training checkpoint holds Adam's `exp_avg` and `exp_avg_sq` "
            "too (notebook 06); `get_state_dict(model, optimizer)` returns both state dicts",
            DCP,
        )
    if any(re.match(r"optim\.state\.\d+\.exp_avg$", k) for k in keys):
        hint(
            "the optimizer's state is keyed by numbers (`optim.state.0.exp_avg`): `optimizer.state_dict()` names "
            "parameters by position; `get_state_dict(model, optimizer)` keys them by parameter name, which any "
            "model with the same names can load",
            DCP,
        )
    for name in _LAYERS:
        for key in (f"model.{name}", f"optim.state.{name}.exp_avg"):
            expect(key in keys, f"the checkpoint has no `{key}`: save the whole model and optimizer state", DCP)
        rows = [c[0] for c in here["chunks"][f"model.{name}"]]
        expect(
            len(rows) == 2,
            f"`model.{name}` was written as {len(rows)} piece(s) of {rows} rows, not as the 2 ranks' shards: "
            "pass `dcp.save` the sharded state dict, each rank its own rows",
            DCP,
        )
        expect(
            len(here["files"][f"model.{name}"]) == 2,
            f"`model.{name}` is all in {here['files'][f'model.{name}']}: each rank should write its own shard",
            DCP,
        )
        expect(
            here["model_equal"][name] and here["adam_equal"][name],
            f"read in this process, the checkpoint's `{name}` (or its Adam state) is not the trained model's: save "
            "the model and optimizer that `save` gets",
            DCP,
        )


def _judge_load(rank: dict, r: int, nproc: int, saved: dict) -> None:
    on = f"on {nproc} process{'es' * (nproc > 1)}"
    made, reads = rank["made"], rank["reads"]
    expect(made, "`load` did not call `make_model()`: build the new model with it (the check passes it)", DCP)
    expect(
        made[0] == "meta",
        '`make_model()` ran outside `with torch.device("meta"):`, so every rank created the whole model in memory; '
        "a model too big for one device cannot be created whole: build it on the meta device, shard it, then "
        "allocate only the shards with `to_empty`",
        DCP,
    )
    expect(reads, "`load` never called `dcp.load`: it reads the checkpoint, in place, into the state dict you give it")
    asked = reads[-1]
    whole = [k for k, (kind, _, shape) in asked.items() if kind == "Tensor" and len(shape) > 0]
    if nproc == 2 and whole:
        hint(
            f"rank {r} asked `dcp.load` for whole tensors (`{whole[0]}` as a plain tensor of shape "
            f"{asked[whole[0]][2]}), so it read the full model: shard the fresh model first, and load into "
            "its own state dict (`get_model_state_dict`), whose DTensors tell each rank which rows to read",
            DCP,
        )
    expect(
        rank["returned"] != "NoneType",
        "`load` returned None: did you forget `return`? It returns the loaded model",
    )
    expect("loaded_params" in rank, f"`load` should return the model, not a {rank['returned']}", DCP)
    expect(
        rank["built_by_make_model"],
        "`load` returned a model that its `make_model()` call did not build: return the new model, filled from "
        "the checkpoint (a model kept from training proves nothing about the checkpoint)",
        DCP,
    )
    params = rank["loaded_params"]
    expect(
        all(f[0] == "DTensor" for f in params.values()),
        f"{on}, the model `load` returned is not sharded: shard it on the mesh the check passes",
        DCP,
    )
    for name, (_, _, mesh_size, local, shape) in params.items():
        expect(
            mesh_size == nproc and local == tuple(_chunk_rows(torch.empty(shape), nproc)[r].shape),
            f"{on}, `{name}` of the loaded model is sharded over {mesh_size} rank(s): use the mesh the check passes",
            DCP,
        )
    if set(rank.get("loaded_units", ())) != set(UNITS):
        hint(
            f"{on}, the model `load` returned is not sharded like `shard` does: its FSDP units are "
            f'{sorted(rank.get("loaded_units", ()))} ("" is the root); with the root alone each forward gathers '
            "the whole model at once: each `nn.Linear` is its own unit, then the model",
            DCP,
        )
    for name, value in rank["loaded"].items():
        if value.device.type != "meta" and (
            torch.equal(value, saved[name]) or torch.equal(value, torch.full_like(value, _KEPT))
        ):
            hint(
                f"{on}, `{name}` of the loaded model holds the trained model's values, not those in the folder `load` "
                "was given: the check passes `load` a checkpoint of the same layout that it wrote after `save`, with "
                "every weight changed, and changed the trained model's too. A job that restarts has nothing but the "
                "folder: read every value from it with `dcp.load`, not from a model or a copy kept in memory",
                DCP,
            )
        expect(
            value.device.type != "meta",
            f"{on}, `{name}` of the loaded model is still on the meta device, without memory: `to_empty(device=...)` "
            "after sharding gives each rank memory for its shards",
            DCP,
        )
        expect(
            torch.equal(value, saved[name] + _SHIFT),
            f"{on}, `{name}` of the loaded model is not the checkpoint's: `dcp.load` fills the state dict you give "
            "it, in place; then `set_model_state_dict` copies it into the model",
            DCP,
        )


@EXERCISES.exercise(3, "Shard, save and reload a model on 2 processes (write a program)", DCP)
def sharded_program(shard, save, load):
    functions = {"shard": shard, "save": save, "load": load}
    stubs = [name for name, fn in functions.items() if _is_stub(fn)]
    if len(stubs) == len(functions):
        raise NotAttempted(
            "Write your code in place of `raise NotImplementedError` in the three functions above, run that cell, "
            "then this one."
        )
    if stubs:
        hint(f"`{stubs[0]}` still raises NotImplementedError: the program calls all three functions")
    source = rules.cell_source(**functions)
    _static_hints(shard, save, load)
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        run = _launch(source, 2, Path(work))
    if run["timed_out"]:
        _exercise_3_runs.pop((source, 2))  # perhaps a busy machine: the next check launches again
        hint(
            f"the program did not finish in {_TIMEOUT_S:.0f} s: a collective that some ranks never call (an "
            "`if rank == 0:` around `dcp.save`, say) leaves the others waiting",
            DCP,
        )
    ranks = run["ranks"]
    if errors := [r["error"] for r in ranks.values() if "error" in r]:
        _error_hint(errors[0], 2)
    if "params" in ranks.get(0, {}):
        _judge_shard(ranks[0])
    expect(not run["failed"], f"the program failed: {run['stderr']}")
    _judge_training(ranks[0])
    _judge_save(ranks[0], run.get("read_here"))
    for r, rank in ranks.items():
        _judge_load(rank, r, 2, ranks[0]["full"])
    return (
        "your program sharded, trained and saved on 2 processes, and loaded a checkpoint of the same layout into a new "
        "model sharded on the 2 processes; this process read yours too, without a process group "
        f"({run['seconds']:.0f} s of launch; "
        f"`runs/{PROGRAM}` is the program, to run by hand with the command in its first lines)"
    )
