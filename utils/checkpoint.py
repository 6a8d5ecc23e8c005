"""Crash-proof training checkpoints: atomic saves, the last N kept, and an exact resume.

Notebook 06 teaches *why* each piece is here and writes the atomic save out in full before using
these helpers. Other code only calls them: notebook 07 saves and resumes a ``GradScaler`` with
``save_checkpoint(..., scaler=...)`` and ``load_checkpoint``, and the DDP scripts of notebook 08
(written by the notebook into ``notebooks/runs/``) write their checkpoints with :func:`atomic_torch_save`::

    from utils.checkpoint import load_checkpoint, latest_checkpoint, save_checkpoint

    if latest_checkpoint(ckpt_dir) is not None:                 # resume after a crash
        info = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, fallback=True)
        start = info.step
    ...
    save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, step=step, keep_last=3)

What a checkpoint holds: the model's ``state_dict`` (of the unwrapped module: no ``module.``
prefix from ``DataParallel``/``DistributedDataParallel``, no ``_orig_mod.`` from
``torch.compile``), the optimizer, LR scheduler and ``GradScaler`` states when given, ``epoch``,
``step``, a small ``extra`` dict of plain values, and the random number generator states of
Python, NumPy and torch (CPU, and every CUDA device when CUDA is available), keyed by the rank of
the process they belong to. Everything is stored as tensors or plain Python values, so the file
loads with ``torch.load(..., weights_only=True)``, which refuses the classes and functions that a
malicious pickle needs (an allow-list, a mitigation rather than a sandbox: keep PyTorch updated,
and share weights with people you do not trust as safetensors).

Random states and ranks: each process of a distributed run has its own generators. By default a
checkpoint holds only the states of the process that saved it, under its rank
(``torch.distributed.get_rank()``, 0 without a process group), and :func:`load_checkpoint`
restores them only on that same rank: on any other rank it raises ``ValueError`` instead of
silently giving rank N the generators of rank 0. To resume every rank exactly, gather all states
on the saving rank and pass them as ``rng_states={rank: state}``::

    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state_dict())            # on every rank
    if dist.get_rank() == 0:
        save_checkpoint(ckpt_dir, model=ddp_model, step=step, rng_states=dict(enumerate(states)))

(or resume with ``restore_rng=False`` and accept a run that is not bit-identical).

How a save survives a crash: the file is written to a temporary name in the same folder,
flushed and ``fsync``-ed, then renamed over the final name with ``os.replace`` and the folder is
``fsync``-ed. On a local POSIX filesystem (Linux, macOS) ``rename`` is atomic: a process killed at
any moment leaves either the old file or the new one under the final name, never half of one (at
worst a hidden ``.*.tmp`` file, which loading ignores and which can be deleted). On Windows
``os.replace`` calls ``MoveFileEx`` with ``MOVEFILE_REPLACE_EXISTING``, which Microsoft does not
document as atomic (and which fails while another process has the target open), and a folder
cannot be ``fsync``-ed there (the helper skips that step where the OS refuses it). Network and
user-space filesystems (NFS, SMB, FUSE mounts, some cloud buckets) may give none of these
guarantees: keep checkpoints on a local disk, or check what your filesystem promises.

Rolling back: saving step ``N`` into a folder first moves every ``checkpoint_<M>.pt`` with
``M > N`` into the sub-folder ``superseded/`` (it belongs to a run you went back from), so that
:func:`latest_checkpoint` can never pick up a stale future step after you resumed from an older
checkpoint. ``keep_last`` then deletes the oldest files so that the newest ``keep_last`` remain.

How a load notices damage: the zip container's CRC-32 checksums are verified before
``torch.load`` (PyTorch itself does not check them when reading), and any failure is raised as
:class:`CheckpointError` naming the file. With ``fallback=True`` the newest *usable* checkpoint
is loaded instead and the damaged ones are reported in :attr:`LoadedCheckpoint.skipped`.

Not saved: the position of a ``DataLoader`` iterator. Make each epoch's shuffle depend only on
``(seed, epoch)`` (a ``torch.Generator`` seeded per epoch) and skip the batches already done
when resuming mid-epoch; notebook 06 shows the pattern.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "LoadedCheckpoint",
    "atomic_torch_save",
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_rng_state_dict",
    "rng_state_dict",
    "save_checkpoint",
    "unwrap_model",
]

CHECKPOINT_FORMAT = "torch-course-checkpoint"
"""Value of the ``"format"`` key of every file written by :func:`save_checkpoint`."""
FORMAT_VERSION = 2
"""Version 2 stores ``"rng"`` as ``{rank: rng_state_dict()}``; version 1 held one state (read as rank 0)."""
SUPERSEDED_DIR = "superseded"
"""Sub-folder that receives checkpoints with a larger number than the one being saved (a rollback)."""
_NAME_RE = re.compile(r"^checkpoint_(\d+)\.pt$")


class CheckpointError(ValueError):
    """A checkpoint file cannot be used (truncated, corrupt, or not a course checkpoint).

    The message always names the file.
    """


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` restored."""

    path: Path
    """The file that was actually loaded (an older one than asked for after a fallback)."""
    epoch: int | None
    step: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    missing_keys: list[str] = field(default_factory=list)
    """Model keys the file did not provide (only possible with ``strict=False``)."""
    unexpected_keys: list[str] = field(default_factory=list)
    """Keys in the file the model does not have (only possible with ``strict=False``)."""
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """``(file, reason)`` for each newer checkpoint that could not be loaded (``fallback=True``)."""


# --------------------------------------------------------------------------- small helpers


def _as_path(value: Any, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__}")
    return Path(value)


def _check_count(value: Any, name: str, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_components(model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    if scheduler is not None and not (
        callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict", None))
    ):
        raise TypeError(
            f"scheduler must have state_dict() and load_state_dict() (an LR scheduler) or be None, "
            f"got {type(scheduler).__name__}"
        )
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}")


def _check_plain(value: Any, where: str) -> None:
    """Refuse values that ``torch.load(weights_only=True)`` could not read back."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{where} has a key of type {type(key).__name__}; use str or int keys")
            _check_plain(item, f"{where}[{key!r}]")
        return
    hint = " (convert NumPy values with .item() or .tolist())" if isinstance(value, (np.ndarray, np.generic)) else ""
    raise TypeError(
        f"{where} is a {type(value).__name__}: extra may hold only None, bool, int, float, str, tensors "
        f"and lists/tuples/dicts of them, so that the file loads with weights_only=True{hint}"
    )


def checkpoint_name(number: int) -> str:
    """File name used in a checkpoint folder: ``checkpoint_00000120.pt`` for step (or epoch) 120."""
    if number is None:
        raise TypeError("number must be an int, got NoneType")
    _check_count(number, "number", 0)
    return f"checkpoint_{int(number):08d}.pt"


def _number(path: Path) -> int:
    match = _NAME_RE.match(path.name)
    return int(match.group(1)) if match else -1


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The ``checkpoint_<number>.pt`` files of ``directory``, oldest (smallest number) first.

    Temporary files of an interrupted save (``.checkpoint_*.tmp``) are not listed. A folder that
    does not exist yet has no checkpoints (an empty list).

    Raises:
        TypeError: ``directory`` is not a str or path.
        NotADirectoryError: ``directory`` is a file.
    """
    folder = _as_path(directory, "directory")
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a checkpoint folder")
    found = [p for p in folder.iterdir() if _NAME_RE.match(p.name) and p.is_file()]
    return sorted(found, key=_number)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint of ``directory`` (largest number), or ``None`` when there is none.

    It is not opened: use ``load_checkpoint(directory, ..., fallback=True)`` to skip a damaged one.
    """
    found = list_checkpoints(directory)
    return found[-1] if found else None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose parameters are saved: without ``DataParallel``/DDP or ``torch.compile`` wrappers."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


# --------------------------------------------------------------------------- random states


def _current_rank() -> int:
    """This process's rank in the default process group, 0 without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return 0


def _check_rng_state(state: Any, where: str) -> None:
    if not isinstance(state, Mapping):
        raise TypeError(f"{where} must be a mapping from rng_state_dict(), got {type(state).__name__}")
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}; make it with rng_state_dict()")


def rng_state_dict() -> dict[str, Any]:
    """The states of Python's ``random``, NumPy's global generator and torch (CPU and CUDA).

    NumPy's state is converted to a tensor and plain numbers so that the result can be saved in a
    file that loads with ``weights_only=True``. Restore it with :func:`load_rng_state_dict`.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_state_dict(state: Mapping[str, Any]) -> None:
    """Restore the generators saved by :func:`rng_state_dict`.

    CUDA states are restored for as many devices as both the file and this machine have; on a
    machine without CUDA they are ignored (a GPU run resumed on a CPU cannot repeat GPU dropout).

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: a key (``python``, ``numpy``, ``torch``) is missing.
    """
    _check_rng_state(state, "RNG state")
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np.asarray(torch.as_tensor(np_state["keys"]).cpu().numpy(), dtype=np.uint32),
            int(np_state["pos"]),
            int(np_state["has_gauss"]),
            float(np_state["cached_gaussian"]),
        )
    )
    torch.set_rng_state(torch.as_tensor(state["torch"]).cpu())
    cuda_states = state.get("cuda")
    if cuda_states and torch.cuda.is_available():
        for index in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(torch.as_tensor(cuda_states[index]).cpu(), index)


# --------------------------------------------------------------------------- saving


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable where the OS allows it; otherwise do nothing.

    On Linux and macOS a folder can be opened read-only and ``fsync``-ed. Windows refuses to open
    a folder with ``os.open`` (``PermissionError``), and some filesystems (network, FUSE) reject
    ``fsync`` on a folder (``EINVAL``): the rename has already happened then, so the save is not
    failed for it, it is only less certain to survive a power cut.
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, target: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, target)`` such that ``target`` is never seen half-written.

    The bytes go to a temporary file in the same folder, are flushed and fsync'ed, and then
    ``os.replace`` puts the file under its final name in one step (the folder is fsync'ed too,
    where the OS allows it). An exception (or a crash) leaves the previous file untouched.
    Returns the target path. The rename is atomic on local POSIX filesystems only; see the module
    docstring for Windows and network filesystems.
    """
    target = _as_path(target, "target")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    crc_was_on = torch.serialization.get_crc32_options()
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o644)  # mkstemp makes 0600; torch.save(path) gives 0644 under umask 022
        with os.fdopen(fd, "wb") as f:
            if not crc_was_on:  # load_checkpoint verifies the zip checksums
                torch.serialization.set_crc32_options(True)
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if not crc_was_on:
            torch.serialization.set_crc32_options(False)
    _fsync_dir(target.parent)
    return target


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    scaler: torch.amp.GradScaler | None = None,
    epoch: int | None = None,
    step: int | None = None,
    extra: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    rank: int | None = None,
    rng_states: Mapping[int, Mapping[str, Any]] | None = None,
) -> Path:
    """Write a full training checkpoint atomically and return its path.

    Args:
        path: a folder, or a file name. A folder (an existing directory, or a path without a
            suffix such as ``runs/exp/ckpt``) receives ``checkpoint_<number>.pt`` where the
            number is ``step``, or ``epoch`` when ``step`` is ``None``; it is created if needed.
            A file name (with a suffix, such as ``last.pt``) is written exactly there.
        model: its ``state_dict`` is saved, unwrapped from DataParallel/DDP/``torch.compile``.
        optimizer, scheduler, scaler: saved when given (an LR scheduler, a ``torch.amp.GradScaler``).
        epoch, step: non-negative ints stored for the resume (and used for the file name).
        extra: small plain values to keep (loss, best metric, config as a dict, ...): None, bool,
            int, float, str, tensors and lists/tuples/dicts of them.
        keep_last: in folder mode, delete older ``checkpoint_*.pt`` files so that the newest
            ``keep_last`` remain (the file just written is never deleted). ``None`` keeps all.
        rank: the rank under which this process's RNG states are stored; by default
            ``torch.distributed.get_rank()``, or 0 without a process group.
        rng_states: ``{rank: rng_state_dict()}`` of several processes (gathered with
            ``dist.all_gather_object``) to store instead of this process's own states, so that
            every rank can resume its own generators.

    The RNG states (Python, NumPy, torch CPU/CUDA) are always saved. Only the final rename makes
    the new file visible, so an exception or a killed process during the save leaves the previous
    checkpoints untouched and nothing under the new name.

    Rollback: in folder mode, checkpoints with a *larger* number than the one being written are
    first moved into the sub-folder ``superseded/`` (replacing a file of the same name there):
    they belong to a run you went back from, and would otherwise stay the "latest" checkpoint.

    Raises:
        TypeError: a component, ``epoch``, ``step``, ``keep_last`` or a value in ``extra`` has the
            wrong type.
        ValueError: a negative number, ``keep_last < 1``, ``keep_last`` with a file name, or a
            folder without ``step`` or ``epoch`` to name the file.
    """
    target = _as_path(path, "path")
    _check_components(model, optimizer, scheduler, scaler)
    _check_count(epoch, "epoch", 0)
    _check_count(step, "step", 0)
    _check_count(keep_last, "keep_last", 1)
    _check_count(rank, "rank", 0)
    if rng_states is None:
        rng = {_current_rank() if rank is None else int(rank): rng_state_dict()}
    else:
        if rank is not None:
            raise ValueError("pass rank= or rng_states=, not both (rng_states already names the ranks)")
        if not isinstance(rng_states, Mapping) or not rng_states:
            raise TypeError(f"rng_states must be a non-empty dict {{rank: rng_state_dict()}}, got {rng_states!r:.60}")
        rng = {}
        for key, state in rng_states.items():
            _check_count(key, "a key of rng_states", 0)
            _check_rng_state(state, f"rng_states[{key}]")
            rng[int(key)] = dict(state)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}")
    extra_dict = dict(extra or {})
    _check_plain(extra_dict, "extra")

    folder_mode = target.is_dir() or (not target.exists() and target.suffix == "")
    if folder_mode:
        number = step if step is not None else epoch
        if number is None:
            raise ValueError(f"saving into the folder {target} needs step= or epoch= to name the file")
        target = target / checkpoint_name(int(number))
        newer = [p for p in list_checkpoints(target.parent) if _number(p) > int(number)]
    elif keep_last is not None:
        raise ValueError(f"keep_last needs a folder to prune, but {target} is a file name")

    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": FORMAT_VERSION,
        "torch_version": str(torch.__version__),
        "epoch": None if epoch is None else int(epoch),
        "step": None if step is None else int(step),
        "model": unwrap_model(model).state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "rng": rng,
        "extra": extra_dict,
    }
    if folder_mode and newer:
        # before the new file appears: a crash in between leaves the older, consistent timeline
        aside = target.parent / SUPERSEDED_DIR
        aside.mkdir(exist_ok=True)
        for stale in newer:
            os.replace(stale, aside / stale.name)
        _fsync_dir(target.parent)
    atomic_torch_save(payload, target)

    if folder_mode and keep_last is not None:
        for old in list_checkpoints(target.parent)[:-keep_last]:
            if old != target:
                old.unlink(missing_ok=True)
    return target


# --------------------------------------------------------------------------- loading


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


def _read(path: Path, map_location: Any, verify: bool) -> dict[str, Any]:
    """Verify and load one checkpoint file; every failure is a :class:`CheckpointError`."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad_member = zf.testzip() if verify else None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as err:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {_first_line(err)})"
        ) from err
    if bad_member is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt: the checksum of {bad_member} does not match")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ValueError...
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded ({type(err).__name__}: {_first_line(err)})"
        ) from err
    if not (
        isinstance(payload, dict)
        and payload.get("format") == CHECKPOINT_FORMAT
        and isinstance(payload.get("model"), Mapping)
    ):
        raise CheckpointError(
            f"checkpoint {path} is not a torch-course checkpoint (was it written by save_checkpoint?)"
        )
    version = payload.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; this code reads <= {FORMAT_VERSION}")
    return payload


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    scaler: torch.amp.GradScaler | None = None,
    map_location: Any = "cpu",
    strict: bool = True,
    restore_rng: bool = True,
    fallback: bool = False,
    verify: bool = True,
    rank: int | None = None,
) -> LoadedCheckpoint:
    """Restore a checkpoint written by :func:`save_checkpoint` into the given objects.

    Args:
        path: a checkpoint file, or a folder (its newest ``checkpoint_*.pt`` is loaded).
        model: receives the saved ``state_dict`` (unwrapped from DataParallel/DDP/``torch.compile``).
        optimizer, scheduler, scaler: restored when given; the file must contain their states.
        map_location: where tensors are materialised while loading (``torch.load``'s argument).
            The default ``"cpu"`` never allocates on a GPU the file names (in DDP every rank would
            otherwise load onto the saving rank's device); ``load_state_dict`` then copies the values
            onto the devices the model and optimizer already use.
        strict: passed to ``model.load_state_dict``; with ``False`` the missing and unexpected keys
            are reported in the result.
        restore_rng: also restore the Python/NumPy/torch random states of this process's rank
            (needed for a bit-identical resume when the model uses dropout or data augmentation).
            A file that holds no states for this rank raises ``ValueError`` (never restores
            another rank's generators); pass ``restore_rng=False`` to resume without them.
        rank: whose RNG states to restore; by default ``torch.distributed.get_rank()``, or 0
            without a process group.
        fallback: when the file is truncated or corrupt, load the newest older checkpoint of the
            same folder that works; the damaged ones are listed in ``result.skipped``.
        verify: check the CRC-32 of every record of the zip file before loading (this reads the
            file once more; a truncated file is detected either way).

    Returns:
        A :class:`LoadedCheckpoint` with the path loaded, ``epoch``, ``step``, ``extra``.

    Raises:
        TypeError: wrong argument types.
        FileNotFoundError: ``path`` does not exist, or the folder holds no checkpoint.
        CheckpointError: (a ``ValueError``) the file, or with ``fallback=True`` every candidate, is
            truncated, corrupt or not a course checkpoint; the message names the file(s).
        ValueError: an optimizer/scheduler/scaler was passed but the file holds no state for it,
            or ``restore_rng=True`` and the file holds no RNG states for this rank.
        RuntimeError: the model does not fit the saved weights (``load_state_dict``'s message,
            prefixed with the file's name). The optimizer, scheduler, scaler and random states are
            not touched then, but ``load_state_dict`` has already copied the tensors that did fit.
    """
    source = _as_path(path, "path")
    _check_components(model, optimizer, scheduler, scaler)
    for flag, name in ((strict, "strict"), (restore_rng, "restore_rng"), (fallback, "fallback"), (verify, "verify")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    _check_count(rank, "rank", 0)

    if source.is_dir():
        candidates = list_checkpoints(source)[::-1]
        if not candidates:
            raise FileNotFoundError(f"no checkpoint_*.pt file in {source}")
    elif source.is_file():
        candidates = [source]
        if _NAME_RE.match(source.name):
            older = [p for p in list_checkpoints(source.parent) if _number(p) < _number(source)]
            candidates += older[::-1]
    else:
        raise FileNotFoundError(f"checkpoint {source} does not exist")

    skipped: list[tuple[Path, str]] = []
    errors: list[CheckpointError] = []
    payload: dict[str, Any] | None = None
    loaded_from = candidates[0]
    for candidate in candidates if fallback else candidates[:1]:
        try:
            payload = _read(candidate, map_location, verify)
        except CheckpointError as err:
            skipped.append((candidate, str(err)))
            errors.append(err)
            continue
        loaded_from = candidate
        break
    if payload is None:
        if not fallback:
            hint = "; pass fallback=True to load an older checkpoint" if len(candidates) > 1 else ""
            raise CheckpointError(f"{errors[0]}{hint}") from errors[0]
        reasons = "\n".join(f"  - {reason}" for _, reason in skipped)
        raise CheckpointError(f"no usable checkpoint among {len(skipped)} file(s):\n{reasons}") from errors[-1]

    for component, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if component is not None and payload.get(key) is None:
            raise ValueError(
                f"checkpoint {loaded_from} holds no {key} state, but {key}= was passed: it was saved without "
                f"save_checkpoint(..., {key}=...); load it without {key}= (that part then starts fresh)"
            )
    rng_state = None
    if restore_rng and payload.get("rng") is not None:
        states = payload["rng"]
        if payload.get("version") == 1 or "python" in states:  # version 1: one state, saved by rank 0
            states = {0: states}
        me = _current_rank() if rank is None else int(rank)
        if me not in states:
            raise ValueError(
                f"checkpoint {loaded_from} holds the random states of rank(s) {sorted(states)}, not of rank {me}: "
                "restoring another rank's generators would give this rank the same random numbers. "
                "Save with rng_states={rank: rng_state_dict()} gathered from every rank, "
                "or load with restore_rng=False (the resume is then not bit-identical)"
            )
        rng_state = states[me]

    try:
        incompatible = unwrap_model(model).load_state_dict(payload["model"], strict=strict)
    except RuntimeError as err:  # missing/unexpected keys or changed shapes: name the file
        raise RuntimeError(
            f"checkpoint {loaded_from} does not fit the model {type(unwrap_model(model)).__name__} "
            f"(build the model with the architecture it was saved from): {err}"
        ) from err
    if optimizer is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None:
        scaler.load_state_dict(payload["scaler"])
    if rng_state is not None:
        load_rng_state_dict(rng_state)
    return LoadedCheckpoint(
        path=loaded_from,
        epoch=payload.get("epoch"),
        step=payload.get("step"),
        extra=dict(payload.get("extra") or {}),
        missing_keys=list(incompatible.missing_keys),
        unexpected_keys=list(incompatible.unexpected_keys),
        skipped=skipped,
    )
