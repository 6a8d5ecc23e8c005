"""What every DDP script of the course shares: joining the process group, reporting, saving results.
Used by notebooks 08 and 09, in the scripts their ``%%writefile`` cells write and
``torchrun`` runs.

A script started by ``torchrun`` reads who it is from environment variables that torchrun sets
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``). :func:`distributed` turns them into a
:class:`DistInfo`, picks the backend and the device, and destroys the process group however the
block ends::

    with distributed() as info:          # gloo + CPU, or NCCL + cuda:LOCAL_RANK
        report(f"I am rank {info.rank} of {info.world_size} on {info.device.type}")
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from utils.checkpoint_files import atomic_torch_save
from utils.device import get_device

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Who this process is in the job, and where it computes."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    device: torch.device
    restart_count: int
    """How often torchrun restarted the worker group before this attempt (0 on the first)."""


def env_int(name: str, default: int | None = None) -> int:
    """An integer environment variable set by torchrun; a clear error when run without torchrun."""
    value = os.environ.get(name)
    if value is None:
        if default is not None:
            return default
        raise RuntimeError(
            f"environment variable {name} is not set: start this script with torchrun, e.g. "
            "`torchrun --standalone --nproc_per_node=2 runs/hello.py` in notebooks/ (notebook 08 writes it)"
        )
    try:
        return int(value)
    except ValueError as err:
        raise RuntimeError(f"environment variable {name}={value!r} is not an integer") from err


def choose_backend(prefer: str = "auto") -> tuple[str, torch.device]:
    """NCCL on ``cuda:LOCAL_RANK`` when this node has a GPU for every local process, else gloo on the CPU.

    ``prefer="cpu"`` forces gloo. No device id is hard-coded: ``LOCAL_RANK`` (0 .. processes on
    this node - 1) is the GPU index, which is why two processes must not share a node's GPU count.
    """
    if prefer not in ("auto", "cpu"):
        raise ValueError(f"prefer must be 'auto' or 'cpu', got {prefer!r}")
    if prefer == "auto" and get_device().type == "cuda":
        local_rank = env_int("LOCAL_RANK")
        if env_int("LOCAL_WORLD_SIZE", 1) <= torch.cuda.device_count():
            return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


@contextmanager
def distributed(prefer: str = "auto", timeout_s: float = 60.0, bind_device: bool = True) -> Iterator[DistInfo]:
    """Join the process group that torchrun prepared; always destroy it when the block ends.

    ``timeout_s`` bounds how long a collective may wait for a missing peer before raising
    (the notes: pass a large enough ``timeout`` when ranks run at different speeds).
    ``bind_device=False`` leaves an NCCL group unbound (no ``device_id``): needed when one process
    drives several GPUs (notebook 09's ``ToyMpModel``), since a bound group refuses tensors on another GPU.
    """
    backend, device = choose_backend(prefer)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if device.type == "cuda" and bind_device:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device)
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        yield DistInfo(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=env_int("LOCAL_RANK"),
            local_world_size=env_int("LOCAL_WORLD_SIZE", 1),
            node_rank=env_int("GROUP_RANK", 0),
            backend=backend,
            device=device,
            restart_count=env_int("TORCHELASTIC_RESTART_COUNT", 0),
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def report(message: str) -> None:
    """Print ``[rank N] message`` (N from ``RANK``) so that the parent can sort the lines by rank.

    The line goes out in one ``os.write`` call: ``print`` may write the text and the newline
    separately, and the lines of two workers sharing one stdout could then interleave.
    """
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"[rank {env_int('RANK', 0)}] {message}\n".encode())


def save_result(out_dir: str | os.PathLike[str] | None, obj: dict) -> None:
    """Write this rank's results to ``out_dir/rank<RANK>.pt`` (read back by ``utils.launch.load_rank_results``)."""
    if out_dir is None:
        return
    if not isinstance(obj, dict):
        raise TypeError(f"results must be a dict, got {type(obj).__name__}")
    atomic_torch_save(obj, Path(out_dir) / f"rank{env_int('RANK', 0)}.pt")


def base_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every script takes: ``--device {auto,cpu}`` and ``--out DIR``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--device",
        choices=("auto", "cpu"),
        default="auto",
        help="auto: NCCL on cuda:LOCAL_RANK when there is a GPU per process, else gloo on CPU",
    )
    parser.add_argument("--out", default=None, help="folder for rank<N>.pt result files")
    return parser
