"""Crash-proof training checkpoints: atomic saves, the last N kept, and an exact resume.
Used by notebooks 06 and 08.

Notebook 06 teaches *why* each piece is here and writes the atomic save and the capture of the random states out
in full before using these helpers. Other code only calls them: the DDP scripts of notebook 08 (written by the
notebook into ``notebooks/runs/``) write their checkpoints with :func:`atomic_torch_save`. Notebook 07 saves a
``GradScaler``'s state with plain ``torch.save`` and names ``save_checkpoint(..., scaler=...)`` as the crash-safe
way. A training loop uses them so::

    from utils.checkpoint_files import load_checkpoint, latest_checkpoint, save_checkpoint

    if latest_checkpoint(ckpt_dir) is not None:                 # resume after a crash
        info = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, fallback=True)
        start = info.step
    ...
    save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, step=step, keep_last=3)

What a checkpoint holds: the model's ``state_dict`` (of the unwrapped module: no ``module.``
prefix from ``DataParallel``/``DistributedDataParallel``, no ``_orig_mod.`` from
``torch.compile``), the optimizer, LR scheduler and ``GradScaler`` states when given, ``epoch``,
``step``, a small ``extra`` dict of plain values, and the random number generator states of
Python, NumPy and torch (CPU, and every CUDA device when CUDA is available, or MPS), keyed by the rank of
the process they belong to, and the class names of the optimizer and scheduler. Everything is
stored as tensors or plain Python values, so the file loads with ``torch.load(...,
weights_only=True)``, which refuses the classes and functions that a malicious pickle needs (an
allow-list, a mitigation rather than a sandbox: keep PyTorch updated, and share weights with people
you do not trust as safetensors). :func:`load_checkpoint` passes ``weights_only=True`` explicitly:
the environment variable ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns off only the default.

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

How a save survives a crash: the file is written to a hidden temporary name in the same folder
(``.checkpoint_<N>.pt.<random>.tmp``, with the permissions that the umask gives, as for
``open()``), flushed and ``fsync``-ed, then renamed over the final name with ``os.replace`` and the
folder is ``fsync``-ed. On a local POSIX filesystem (Linux, macOS) ``rename`` is atomic: a process
killed at any moment leaves either the old file or the new one under the final name, never half of
one. What a killed save leaves is its temporary file, which loading ignores. Its writer holds a lock
(``flock``) on it until the rename; the kernel releases the lock when the file is closed, and a process
that dies, however it dies, has all its files closed. So the next save into the folder deletes the
temporary files that nobody locks, never one that a live writer is still writing (on Windows, which
has no ``flock``, those older than an hour). A full disk (or a used-up quota, or
the process's file size limit) raises ``OSError`` with that errno and a message naming the file,
instead of torch's ``[enforce fail at inline_container.cc:672] . unexpected pos ...``; the
temporary file is deleted then, as after any failed save. On Windows
``os.replace`` calls ``MoveFileEx`` with ``MOVEFILE_REPLACE_EXISTING``, which Microsoft does not
document as atomic (and which fails while another process has the target open), and a folder
cannot be ``fsync``-ed there (the helper skips that step where the OS refuses it). Network and
user-space filesystems (NFS, SMB, FUSE mounts, some cloud buckets) may give none of these
guarantees: keep checkpoints on a local disk, or check what your filesystem promises.

Rolling back: saving step ``N`` into a folder first moves every ``checkpoint_<M>.pt`` with
``M > N`` into the sub-folder ``superseded/`` (it belongs to a run you went back from), so that
:func:`latest_checkpoint` can never pick up a stale future step after you resumed from an older
checkpoint. ``keep_last`` then deletes the oldest files so that the newest ``keep_last`` remain, in the
folder and in ``superseded/``. Two processes saving into one folder (every DDP rank saving, without
``if rank == 0``) keep rolling each other back: a save that moves aside a file another process wrote
since this process's last save warns, naming the folder.

Another format: a file of an older format version is refused with the way to convert it; one of a
newer version (:class:`NewerCheckpointError`: a newer course wrote it) is refused with the advice to
update the course, is never skipped by ``fallback=True``, and a save that would replace, move aside
or prune it is refused too, so nothing a newer course wrote is lost. A folder that cannot be written
(read-only, another user's) is named in the error, with the fix.

How a load notices damage: every file that :func:`atomic_torch_save` writes ends with the SHA-256
of all its other bytes, stored as the zip archive's comment (a free field after the central directory:
zip readers report it apart from the archived files, ``zipfile.ZipFile(path).comment``, and
``torch.load`` ignores it), and :func:`load_checkpoint` compares it before ``torch.load`` runs. Any changed byte
raises :class:`CheckpointError` naming the file, including a byte of the zip's central directory,
which the per-record CRC-32s do not cover and where one flipped bit can make ``torch.load`` return
a tensor of garbage (bytes from elsewhere, or uninitialised memory) without an error.
Why a digest *inside* the file: the atomic rename then publishes data and digest in one step. A sidecar file would
need a second rename, and a crash between the two would leave a checkpoint and a digest that disagree; checking the
zip structure record by record (directory against local headers, each record's size against the storage the pickle
expects) is long code that still trusts whatever it forgets. The digest detects damage, not
tampering (anybody can recompute it), which is why the load still uses ``weights_only=True``. A
file without one (written by plain ``torch.save``, or by an older version of this module) gets the
weaker check of each record's CRC-32, none when it was written with CRC-32s off (they are all 0
then). With ``fallback=True`` the newest *usable* checkpoint is loaded instead and the damaged ones
are reported in :attr:`LoadedCheckpoint.skipped`. A file that a concurrent save deletes between
the listing and the read (``keep_last`` pruning) is not damaged: the folder is listed again.

Loading is all or nothing: the model's keys and shapes, the optimizer's and scheduler's classes,
the optimizer's parameter groups and the random states are checked before anything changes, so
a failed :func:`load_checkpoint` leaves the model, optimizer, scheduler, scaler and generators as
they were.

Not saved: the position of a ``DataLoader`` iterator. Make each epoch's shuffle depend only on
``(seed, epoch)`` (a ``torch.Generator`` seeded per epoch) and skip the batches already done
when resuming mid-epoch; notebook 06 shows the pattern.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import re
import secrets
import struct
import time
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

import numpy as np
import torch
from torch import nn

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "NewerCheckpointError",
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
FORMAT_VERSION = 3
"""The one format this module writes and reads: files end with their SHA-256, name the optimizer's and scheduler's
classes and store ``"rng"`` as ``{rank: rng_state_dict()}``. Files of another version are refused, never rewritten."""
SUPERSEDED_DIR = "superseded"
"""Sub-folder that receives checkpoints with a larger number than the one being saved (a rollback)."""
_NAME_PATTERN = r"checkpoint_(\d+)\.pt"
_NAME_RE = re.compile(f"^{_NAME_PATTERN}$")
_EOCD_SIGNATURE, _EOCD_SIZE = b"PK\x05\x06", 22
"""The end-of-central-directory record that ends a zip file (followed only by the archive comment)."""
_DIGEST_PREFIX = b"torch-course-sha256:"
_DIGEST_SIZE = len(_DIGEST_PREFIX) + 64
STALE_TEMP_SECONDS = 3600
"""On Windows (no ``flock``), the age after which an unlocked temporary file counts as abandoned."""
_NOT_WRITABLE = {errno.EROFS: "is on a read-only filesystem", errno.EACCES: "is not writable by you"}
_NOT_WRITABLE[errno.EPERM] = _NOT_WRITABLE[errno.EACCES]
_NO_ROOM = {
    errno.ENOSPC: ("no space left on the device", "free some space, or save elsewhere"),
    errno.EFBIG: ("the file would exceed this process's file size limit", "raise it (ulimit -f), or save less"),
}
if hasattr(errno, "EDQUOT"):
    _NO_ROOM[errno.EDQUOT] = ("no space left within the disk quota", "free some space, or save elsewhere")


class CheckpointError(ValueError):
    """A checkpoint file cannot be used (truncated, corrupt, or not a course checkpoint).

    The message always names the file.
    """


class NewerCheckpointError(CheckpointError):
    """A checkpoint written by a newer version of the course (a higher format version).

    Not damage: ``fallback=True`` does not skip it (an older checkpoint would be loaded and the next save
    would replace or move the newer file), and :func:`save_checkpoint` refuses to replace, move or prune it.
    The fix is to update this copy of the course.
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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


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


def _class_name(component: Any) -> str | None:
    return None if component is None else type(component).__qualname__


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
    """The states of Python's ``random``, NumPy's global generator and torch (CPU, and CUDA or MPS).

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
    if torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def load_rng_state_dict(state: Mapping[str, Any]) -> None:
    """Restore the generators saved by :func:`rng_state_dict`, all of them or none.

    CUDA states are restored for as many devices as both the file and this machine have; on a
    machine without CUDA they are ignored (a GPU run resumed on a CPU cannot repeat GPU dropout).
    The MPS state (Apple GPUs) likewise, where MPS is available.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: a key (``python``, ``numpy``, ``torch``) is missing, or a state is malformed (a
            generator refuses it); every generator then keeps the state it had before the call.
    """
    _check_rng_state(state, "RNG state")
    before = rng_state_dict()
    try:
        _set_rng_states(state)
    except Exception as err:  # random, NumPy and torch each raise their own types for a malformed state
        _set_rng_states(before)
        raise ValueError(
            f"RNG state cannot be restored ({type(err).__name__}: {_first_line(err)}); the generators are unchanged"
        ) from err


def _set_rng_states(state: Mapping[str, Any]) -> None:
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
    mps_state = state.get("mps")
    if mps_state is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(torch.as_tensor(mps_state).cpu())


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


def _sha256(f: BinaryIO, size: int) -> bytes:
    """Hex SHA-256 of the first ``size`` bytes of the open file ``f``."""
    f.seek(0)
    digest = hashlib.sha256()
    while size > 0:
        chunk = f.read(min(size, 1 << 20))
        if not chunk:
            break
        digest.update(chunk)
        size -= len(chunk)
    return digest.hexdigest().encode()


def _append_digest(f: BinaryIO) -> None:
    """End the zip file that ``torch.save`` just wrote to ``f`` with the SHA-256 of all its bytes.

    The digest becomes the zip archive's comment, the only place the zip format leaves free at the
    end: the comment's length goes into the last two bytes of the end-of-central-directory record
    (0 as torch writes it), the digest covers every byte up to there, and the comment follows.
    Zip readers report the comment apart from the archived files; ``torch.load`` ignores it.
    """
    end = f.seek(0, os.SEEK_END)
    f.seek(end - _EOCD_SIZE)
    record = f.read(_EOCD_SIZE)
    if not (record.startswith(_EOCD_SIGNATURE) and record.endswith(b"\0\0")):
        raise RuntimeError(
            "torch.save wrote a zip file that does not end with an empty comment; cannot add the checksum"
        )
    f.seek(end - 2)
    f.write(struct.pack("<H", _DIGEST_SIZE))
    f.flush()
    digest = _sha256(f, end)
    f.seek(end)
    f.write(_DIGEST_PREFIX + digest)


def _create_temp(target: Path) -> tuple[int, Path]:
    """Create and lock the hidden temporary file of a save of ``target``; return its descriptor and path.

    ``os.open`` with mode 0o666 lets the umask decide the permissions, as ``open()`` and a plain
    ``torch.save(path)`` do (``tempfile.mkstemp`` would always give 0o600). The lock (``flock``) is
    held until the file has its final name. The kernel releases an ``flock`` when the last descriptor
    of the open file is closed: when the writer dies, at the latest (had it forked meanwhile, once the
    child has exited too). So a temporary file that nobody locks belongs to a dead writer
    (:func:`_remove_if_abandoned`).
    """
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        if fcntl is None:  # Windows: no flock; cleaners go by the file's age there
            return fd, tmp
        with contextlib.suppress(OSError):  # a filesystem without locks: cleaners cannot lock it either
            fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink:
            return fd, tmp
        os.close(fd)  # a cleaner took it for abandoned between os.open and flock: take another name


def _remove_if_abandoned(tmp: Path) -> None:
    """Delete the temporary file of a save unless its writer is still alive."""
    if fcntl is None:  # Windows: no flock; an old file is abandoned (one its writer holds open cannot be deleted)
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                tmp.unlink()
        return
    try:
        fd = os.open(tmp, os.O_RDWR)  # read-write: NFS emulates flock with write locks
    except OSError:
        return  # gone already, or another user's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # locked (BlockingIOError): its writer is alive
    else:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # while we hold the lock: a writer locking after us sees the file gone and starts again
    finally:
        os.close(fd)


def _remove_stale_temporaries(folder: Path, names: str) -> None:
    """Delete what killed saves left in ``folder``: temporary files (``names``: a regex of final names)."""
    pattern = re.compile(rf"^\.(?:{names})\.[0-9a-z_]{{8}}\.tmp$")
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if pattern.match(entry.name):
                _remove_if_abandoned(Path(entry.path))


def _out_of_space(err: BaseException, target: Path) -> OSError | None:
    """``err`` as a short error naming ``target`` when a full disk or a size limit caused it, else None.

    Writing to a file object, ``torch.save`` turns the ``OSError`` of a full disk into a bare
    ``RuntimeError`` ("[enforce fail at inline_container.cc:672] . unexpected pos 5120 vs 5014"),
    keeping the ``OSError`` only as its ``__context__``; so the whole chain is searched.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in _NO_ROOM:
            reason, advice = _NO_ROOM[cause.errno]
            return OSError(
                cause.errno,
                f"cannot save {target}: {reason} ({cause.strerror}); {advice}. "
                "The previous file of that name is unchanged and no temporary file was left.",
            )
        if isinstance(cause, OSError) and cause.errno in _NOT_WRITABLE:
            return _not_writable(cause, target)
        cause = cause.__cause__ or cause.__context__
    return None


def _make_folder(folder: Path, target: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno in _NOT_WRITABLE:
            raise _not_writable(err, target) from None
        raise


def _not_writable(err: OSError, target: Path) -> OSError:
    """``err`` (read-only filesystem, no permission) as a message naming the folder and the fix (probe CK5)."""
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the nearest folder that exists is the one that refused
    return type(err)(
        err.errno,
        f"cannot save {target}: the folder {folder} {_NOT_WRITABLE[err.errno]} ({err.strerror}); "
        "save into a folder you can write to (or make this one writable). Nothing was written.",
    )


def atomic_torch_save(obj: Any, target: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, target)`` such that ``target`` is never seen half-written.

    The bytes go to a temporary file in the same folder (locked while it is written), end with the
    SHA-256 of the file (the zip's comment, which ``torch.load`` ignores and :func:`load_checkpoint`
    verifies), are flushed and fsync'ed, and then ``os.replace`` puts the file under its final name
    in one step (the folder is fsync'ed too, where the OS allows it). An exception (or a crash)
    leaves the previous file untouched; temporary files that killed saves of ``target`` left behind
    are deleted afterwards. The file's permissions follow the umask. Returns the target path. The
    rename is atomic on local POSIX filesystems only; see the module docstring for Windows and
    network filesystems.

    Raises:
        TypeError: ``target`` is not a str or path.
        OSError: with the errno of the failure; for a full disk (``ENOSPC``), a used-up quota
            (``EDQUOT``) or the process's file size limit (``EFBIG``) a message that names the file.
    """
    target = _as_path(target, "target")
    _make_folder(target.parent, target)
    fd, tmp = -1, None
    try:
        fd, tmp = _create_temp(target)
        with open(fd, "w+b", closefd=False) as f:
            torch.save(obj, f)
            _append_digest(f)
            f.flush()
            os.fsync(fd)
        if fcntl is None:  # Windows cannot rename a file that is open
            os.close(fd)
            fd = -1
        os.replace(tmp, target)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        short = _out_of_space(err, target)
        if short is None:
            raise
        raise short from err
    finally:
        if fd >= 0:
            os.close(fd)  # and with it the lock, only now that the file has its final name
    _fsync_dir(target.parent)
    _remove_stale_temporaries(target.parent, re.escape(target.name))
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
            ``keep_last`` remain (the file just written is never deleted), in the folder and in its
            ``superseded/``. ``None`` keeps all.
        rank: the rank under which this process's RNG states are stored; by default
            ``torch.distributed.get_rank()``, or 0 without a process group.
        rng_states: ``{rank: rng_state_dict()}`` of several processes (gathered with
            ``dist.all_gather_object``) to store instead of this process's own states, so that
            every rank can resume its own generators.

    The RNG states (Python, NumPy, torch CPU/CUDA/MPS) are always saved. Only the final rename makes
    the new file visible, so an exception or a killed process during the save leaves the previous
    checkpoints untouched and nothing under the new name. In folder mode, the temporary files that
    killed saves left in the folder are deleted afterwards (see :func:`atomic_torch_save`).

    Rollback: in folder mode, checkpoints with a *larger* number than the one being written are
    first moved into the sub-folder ``superseded/`` (replacing a file of the same name there):
    they belong to a run you went back from, and would otherwise stay the "latest" checkpoint.

    Raises:
        TypeError: a component, ``epoch``, ``step``, ``keep_last`` or a value in ``extra`` has the
            wrong type.
        ValueError: a negative number, ``keep_last < 1``, ``keep_last`` with a file name, or a
            folder without ``step`` or ``epoch`` to name the file.
        NewerCheckpointError: the save would replace, move aside or prune a checkpoint of a newer format.
        OSError: the file cannot be written; a full disk says so and names the file, a read-only
            folder names the folder.
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
        existing = list_checkpoints(target.parent)
        newer = [p for p in existing if _number(p) > int(number)]
        _refuse_to_touch_newer_format(existing, target, keep_last)
        _warn_if_another_writer(target.parent, newer)
    elif keep_last is not None:
        raise ValueError(f"keep_last needs a folder to prune, but {target} is a file name")
    elif target.is_file() and (version := _newer_format_version(target)) is not None:
        raise _newer_error(target, version)  # a file name such as last.pt: not replaced either

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
        "classes": {"optimizer": _class_name(optimizer), "scheduler": _class_name(scheduler)},
        "rng": rng,
        "extra": extra_dict,
    }
    if folder_mode and newer:
        # before the new file appears: a crash in between leaves the older, consistent timeline
        aside = target.parent / SUPERSEDED_DIR
        try:
            aside.mkdir(exist_ok=True)
            for stale in newer:
                os.replace(stale, aside / stale.name)
        except OSError as err:
            if err.errno in _NOT_WRITABLE:
                raise _not_writable(err, target) from None
            raise
        _fsync_dir(target.parent)
    atomic_torch_save(payload, target)

    if folder_mode:
        _LAST_SAVED[target.parent.resolve()] = _mtime_ns(target)
        if keep_last is not None:
            for old in list_checkpoints(target.parent)[:-keep_last]:
                if old != target:
                    old.unlink(missing_ok=True)
            # superseded/ is bounded the same way: writers that roll each other back would fill it (probe CK1)
            for old in list_checkpoints(target.parent / SUPERSEDED_DIR)[:-keep_last]:
                old.unlink(missing_ok=True)
        _remove_stale_temporaries(target.parent, _NAME_PATTERN)  # of every step, not only this one
    return target


_LAST_SAVED: dict[Path, int] = {}
"""For each folder this process saved into: the modification time (ns) of the file it saved last."""


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _refuse_to_touch_newer_format(existing: list[Path], target: Path, keep_last: int | None) -> None:
    """Raise :class:`NewerCheckpointError` when this save would replace, move aside or prune a checkpoint of a
    newer format (probe CK4): the file of the same number and every larger one are read (their pickle
    only), and with ``keep_last`` every file it could delete."""
    number = _number(target)
    at_risk = [p for p in existing if _number(p) >= number]
    if keep_last is not None:
        at_risk += existing[: max(0, len(existing) + 1 - keep_last)]
    for path in dict.fromkeys(at_risk):
        version = _newer_format_version(path)
        if version is not None:
            raise _newer_error(path, version)


def _warn_if_another_writer(folder: Path, newer: list[Path]) -> None:
    """Warn when a rollback would move aside a checkpoint that another process wrote after this process's last
    save into ``folder``: two writers in one folder (every DDP rank saving, without ``if rank == 0``) keep rolling
    each other back (probe CK1)."""
    last = _LAST_SAVED.get(folder.resolve())
    if last is None or not newer:
        return
    if any(_mtime_ns(p) > last for p in newer):
        warnings.warn(
            f"save_checkpoint: another process is saving into {folder} too (a checkpoint with a larger number "
            "appeared there after this process's last save, and is now moved to superseded/). Save from one "
            "process only (in DDP: if rank == 0), or give each writer its own folder.",
            stacklevel=3,
        )


# --------------------------------------------------------------------------- loading


def _check_digest(f: BinaryIO, path: Path) -> bool:
    """Whether the open file ends with the SHA-256 that :func:`atomic_torch_save` appends; it must match.

    Returns False for a file without one (written by plain ``torch.save``, or by older versions).
    A file counts as having one when its last bytes start with the digest's prefix *or* its zip
    record says that a comment of the digest's length follows: one changed byte cannot hide both.

    Raises:
        CheckpointError: the file ends with a digest that its bytes do not match.
    """
    size = os.fstat(f.fileno()).st_size
    if size < _EOCD_SIZE + _DIGEST_SIZE:
        return False
    f.seek(size - _EOCD_SIZE - _DIGEST_SIZE)
    record, stored = f.read(_EOCD_SIZE), f.read()
    if not (
        stored.startswith(_DIGEST_PREFIX)
        or record == record[:20] + struct.pack("<H", _DIGEST_SIZE)
        and record.startswith(_EOCD_SIGNATURE)
    ):
        return False
    if _DIGEST_PREFIX + _sha256(f, size - _DIGEST_SIZE) != stored:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: "
            "the checksum (SHA-256) of its bytes does not match the one stored at its end"
        )
    return True


def _check_zip_crcs(f: BinaryIO, path: Path) -> None:
    """What can be checked in a file without a SHA-256: that it is a zip file, and each record's CRC-32.

    Neither covers the zip's central directory. A file written with CRC-32s off
    (``torch.serialization.set_crc32_options(False)``) stores 0 for every record: nothing to compare.
    """
    try:
        with zipfile.ZipFile(f) as zf:
            unchecked = all(info.CRC == 0 for info in zf.infolist())
            bad_member = None if unchecked else zf.testzip()
    except Exception as err:  # BadZipFile, EOFError, NotImplementedError ("zip file version"), RuntimeError...
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {_first_line(err)})"
        ) from err
    if bad_member is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt: the checksum of {bad_member} does not match")


def _read(path: Path, map_location: Any, verify: bool) -> dict[str, Any]:
    """Verify and load one checkpoint file; every failure is a :class:`CheckpointError`.

    Except ``FileNotFoundError``: the file was deleted (pruned by a save) since it was listed. It is
    opened once, so a deletion after that changes nothing (on POSIX systems).
    """
    try:
        with open(path, "rb") as f:
            has_digest = verify and _check_digest(f, path)
            if verify and not has_digest:
                _check_zip_crcs(f, path)
            f.seek(0)
            try:  # weights_only explicit: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 changes only the default
                payload = torch.load(f, map_location=map_location, weights_only=True)
            except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ValueError...
                raise CheckpointError(
                    f"checkpoint {path} cannot be loaded ({type(err).__name__}: {_first_line(err)})"
                ) from err
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}: {_first_line(err)})") from err
    if not (
        isinstance(payload, dict)
        and payload.get("format") == CHECKPOINT_FORMAT
        and isinstance(payload.get("model"), Mapping)
    ):
        raise CheckpointError(
            f"checkpoint {path} is not a torch-course checkpoint (was it written by save_checkpoint?)"
        )
    version = payload.get("version")
    if _is_newer(version):
        raise _newer_error(path, version)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}; this code reads version {FORMAT_VERSION} only: "
            "it was written by an older version of the course; load its weights with torch.load(path, "
            "weights_only=True)['model'] and save a new checkpoint (the file is left as it is)"
        )
    return payload


def _is_newer(version: Any) -> bool:
    return isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION


def _newer_error(path: Path, version: int) -> NewerCheckpointError:
    return NewerCheckpointError(
        f"checkpoint {path} has format version {version}; this code reads version {FORMAT_VERSION} only: it was "
        "written by a newer version of the course, and is not damaged. Update this copy of the course "
        "(git pull, then make venv) to load it. Until then the file is left as it is, and saves into "
        f"{path.parent} that would replace, move or prune it are refused: save elsewhere meanwhile"
    )


def _newer_format_version(path: Path) -> int | None:
    """The format version of ``path`` when it is a readable course checkpoint of a newer format, else None.

    Only the pickle is read (``mmap``: the tensors stay on disk); a damaged or foreign file gives None.
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # damaged, foreign, deleted meanwhile: not a newer checkpoint as far as we can tell
        return None
    if isinstance(payload, dict) and payload.get("format") == CHECKPOINT_FORMAT and _is_newer(payload.get("version")):
        return payload["version"]
    return None


def _check_map_location(map_location: Any) -> None:
    """Refuse a device this machine does not have before reading anything: no other file can help then."""
    targets = list(map_location.values()) if isinstance(map_location, Mapping) else [map_location]
    for where in targets:
        if not isinstance(where, (str, torch.device)):
            continue  # None or a function: torch.load decides
        try:
            device = torch.device(where)
        except RuntimeError as err:
            raise ValueError(f"map_location={map_location!r} is not a device ({_first_line(err)})") from err
        available = getattr(getattr(torch, device.type, None), "is_available", None)  # torch.cuda, torch.mps...
        if callable(available) and not available():
            raise ValueError(
                f"map_location={map_location!r} names a {device.type} device, but this machine has none "
                f"(torch.{device.type}.is_available() is False): load with map_location='cpu' (the default); "
                "load_state_dict then copies the values onto the device the model is on"
            )


def _candidates(source: Path, fallback: bool) -> Callable[[], list[Path]]:
    """A function listing the files to try, newest first; called again when one was deleted meanwhile."""
    if source.is_dir():
        return lambda: list_checkpoints(source)[::-1]
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {source} does not exist")
    number = _number(source)
    if not fallback or number < 0:
        return lambda: [source]
    return lambda: [source, *(p for p in list_checkpoints(source.parent)[::-1] if _number(p) < number)]


def _has_older(path: Path) -> bool:
    number = _number(path)
    return number >= 0 and any(_number(p) < number for p in list_checkpoints(path.parent))


def _read_newest_usable(
    source: Path, listing: Callable[[], list[Path]], map_location: Any, verify: bool, fallback: bool
) -> tuple[dict[str, Any], Path, list[tuple[Path, str]]]:
    """The payload of the first listed file that loads (only the first with ``fallback=False``).

    A file deleted between the listing and its opening (a concurrent save pruned it, or replaced
    the newest) is not damage: the folder is listed again and the newest file not yet tried is next.
    """
    failed: list[tuple[Path, CheckpointError]] = []
    tried: set[Path] = set()
    while fallback or not failed:
        remaining = [p for p in listing() if p not in tried]
        if not remaining:
            break
        tried.add(remaining[0])
        try:
            payload = _read(remaining[0], map_location, verify)
        except FileNotFoundError:
            continue
        except NewerCheckpointError:
            raise  # not damage: loading an older one would let the next save replace or move it
        except CheckpointError as err:
            failed.append((remaining[0], err))
            continue
        return payload, remaining[0], [(p, str(err)) for p, err in failed]
    if not failed:
        if source.is_dir():
            raise FileNotFoundError(f"no checkpoint_*.pt file in {source}")
        raise FileNotFoundError(f"checkpoint {source} was deleted before it could be read")
    if not fallback:
        path, err = failed[0]
        hint = "; pass fallback=True to load an older checkpoint" if _has_older(path) else ""
        raise CheckpointError(f"{err}{hint}") from err
    reasons = "\n".join(f"  - {err}" for _, err in failed)
    raise CheckpointError(f"no usable checkpoint among {len(failed)} file(s):\n{reasons}") from failed[-1][1]


def _listed(label: str, items: list[str], most: int = 5) -> list[str]:
    """``["label a, b, c and 4 more"]``, or ``[]`` without items."""
    if not items:
        return []
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return [f"{label} {', '.join(items[:most])}{more}"]


def _shapes_differ(saved: torch.Tensor, current: torch.Tensor) -> bool:
    """What ``load_state_dict`` calls a size mismatch."""
    if torch.nn.parameter.is_lazy(current):
        return False
    if current.dim() == 0 and saved.shape == (1,):  # accepted for files of PyTorch 0.3
        return False
    return saved.shape != current.shape


def _prefix_hint(saved: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """How to fix a file whose keys all carry a wrapper's prefix that the model's keys lack ("" otherwise)."""
    for prefix, wrapper in (("module.", "DataParallel or DistributedDataParallel"), ("_orig_mod.", "torch.compile")):
        if saved and all(k.startswith(prefix) for k in saved) and not any(k.startswith(prefix) for k in expected):
            return (
                f". All its keys start with '{prefix}': the state_dict of a {wrapper} wrapper, which "
                "save_checkpoint never writes (it unwraps the model). Strip the prefix: payload = "
                "torch.load(file, weights_only=True); torch.nn.modules.utils.consume_prefix_in_state_dict_if_present("
                f"payload['model'], '{prefix}'); utils.checkpoint_files.atomic_torch_save(payload, file) "
                '(notebook 06, section 8, "The module. prefix of DataParallel and DDP")'
            )
    return ""


def _check_model_fits(saved: Mapping[str, Any], module: nn.Module, strict: bool, path: Path) -> None:
    """Raise what ``module.load_state_dict(saved, strict=strict)`` would raise, before it copies anything.

    ``load_state_dict`` copies each module's tensors as it goes and reports all problems at the end:
    a size mismatch in the last layer leaves the first layers overwritten. Keys and shapes are the
    checks it makes for modules without load hooks of their own (PyTorch's modules included).
    """
    expected = module.state_dict()
    problems = []
    if strict:
        problems += _listed("missing keys", [k for k in expected if k not in saved])
        problems += _listed("unexpected keys", [k for k in saved if k not in expected])
    mismatched = [
        f"{key}: {tuple(value.shape)} in the checkpoint, {tuple(expected[key].shape)} in the model"
        for key, value in saved.items()
        if isinstance(value, torch.Tensor)
        and isinstance(expected.get(key), torch.Tensor)
        and _shapes_differ(value, expected[key])
    ]
    problems += _listed("size mismatch for", mismatched)
    if problems:
        raise RuntimeError(
            f"checkpoint {path} does not fit the model {type(module).__name__} (build the model with the "
            f"architecture it was saved from): {'; '.join(problems)}{_prefix_hint(saved, expected)}"
        )


def _check_optimizer_fits(saved: Any, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The check of ``optimizer.load_state_dict``, before anything is loaded: the same parameter groups."""
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) and "params" in g for g in groups):
        raise CheckpointError(f"checkpoint {path} holds a malformed optimizer state")
    sizes = [len(g["params"]) for g in groups]
    wanted = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != wanted:
        raise ValueError(
            f"checkpoint {path} holds the optimizer state of parameter groups of sizes {sizes}, but the optimizer "
            f"has {wanted}: build it over the same parameters, in the same groups, as the run that saved it "
            "(or load without optimizer=, which then starts fresh)"
        )


def _check_components_fit(
    payload: Mapping[str, Any],
    path: Path,
    module: nn.Module,
    strict: bool,
    optimizer: Any,
    scheduler: Any,
    scaler: Any,
) -> None:
    """Everything that can be checked without changing the objects; nothing is loaded before it passed."""
    recorded = payload["classes"]
    for component, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if component is None:
            continue
        if payload.get(key) is None:
            raise ValueError(
                f"checkpoint {path} holds no {key} state, but {key}= was passed: it was saved without "
                f"save_checkpoint(..., {key}=...); load it without {key}= (that part then starts fresh)"
            )
        if recorded.get(key) not in (None, _class_name(component)):
            raise ValueError(
                f"checkpoint {path} was saved with the {key} {recorded[key]}, but {key}= is an instance of "
                f"{_class_name(component)}: build the {key} the run used, or load without {key}= (it then starts fresh)"
            )
    _check_model_fits(payload["model"], module, strict, path)
    if optimizer is not None:
        _check_optimizer_fits(payload["optimizer"], optimizer, path)
    if scaler is not None and scaler.is_enabled() and not payload["scaler"]:
        raise ValueError(f"checkpoint {path} holds the state of a disabled GradScaler: load without scaler=")


def _rng_state_to_restore(payload: Mapping[str, Any], path: Path, rank: int | None) -> Mapping[str, Any] | None:
    states = payload.get("rng")
    if states is None:
        return None
    if not isinstance(states, Mapping):
        raise CheckpointError(f"checkpoint {path} holds malformed random states; load it with restore_rng=False")
    me = _current_rank() if rank is None else int(rank)
    if me not in states:
        raise ValueError(
            f"checkpoint {path} holds the random states of rank(s) {sorted(states)}, not of rank {me}: "
            "restoring another rank's generators would give this rank the same random numbers. "
            "Save with rng_states={rank: rng_state_dict()} gathered from every rank, "
            "or load with restore_rng=False (the resume is then not bit-identical)"
        )
    return states[me]


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
    """Restore a checkpoint written by :func:`save_checkpoint` into the given objects, all or nothing.

    Everything is checked before anything changes: if this raises, the model, optimizer,
    scheduler, scaler and random generators hold what they held before the call.

    Args:
        path: a checkpoint file, or a folder (its newest ``checkpoint_*.pt`` is loaded; a file
            deleted by a concurrent save between listing and reading is skipped, and the folder
            listed again).
        model: receives the saved ``state_dict`` (unwrapped from DataParallel/DDP/``torch.compile``).
        optimizer, scheduler, scaler: restored when given; the file must contain their states, of
            the same classes (the file records them), and the optimizer the same
            parameter groups.
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
            same folder that works; the damaged ones are listed in ``result.skipped``. A file of a
            newer format is not damaged: it raises :class:`NewerCheckpointError` either way.
        verify: check the file's SHA-256 (the CRC-32 of each record for a file without one) before
            loading; this reads the file once more. A truncated file is detected either way.

    Returns:
        A :class:`LoadedCheckpoint` with the path loaded, ``epoch``, ``step``, ``extra``.

    Raises:
        TypeError: wrong argument types.
        FileNotFoundError: ``path`` does not exist, or the folder holds no checkpoint.
        CheckpointError: (a ``ValueError``) the file, or with ``fallback=True`` every candidate, is
            truncated, corrupt or not a course checkpoint, or its random state for this rank is
            malformed; the message names the file(s). :class:`NewerCheckpointError` (a subclass): the
            file was written by a newer version of the course.
        ValueError: ``map_location`` names a device this machine lacks; an optimizer/scheduler/scaler
            was passed but the file holds no state for it, or one of another class, or the
            optimizer's parameter groups differ; or ``restore_rng=True`` and the file holds no RNG
            states for this rank.
        RuntimeError: the model does not fit the saved weights (missing or unexpected keys, a size
            mismatch; the message names the file and hints at a ``module.`` prefix).
    """
    source = _as_path(path, "path")
    _check_components(model, optimizer, scheduler, scaler)
    for flag, name in ((strict, "strict"), (restore_rng, "restore_rng"), (fallback, "fallback"), (verify, "verify")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    _check_count(rank, "rank", 0)
    _check_map_location(map_location)

    payload, loaded_from, skipped = _read_newest_usable(
        source, _candidates(source, fallback), map_location, verify, fallback
    )
    module = unwrap_model(model)
    _check_components_fit(payload, loaded_from, module, strict, optimizer, scheduler, scaler)
    rng_state = _rng_state_to_restore(payload, loaded_from, rank) if restore_rng else None

    # The random states first: trying them is their only complete check, and a refused one is undone.
    before = rng_state_dict() if rng_state is not None else None
    if rng_state is not None:
        try:
            load_rng_state_dict(rng_state)
        except (TypeError, ValueError) as err:
            cause = err.__cause__ or err  # what the generator said, or which key is missing
            raise CheckpointError(
                f"checkpoint {loaded_from} holds a malformed random state ({type(cause).__name__}: "
                f"{_first_line(cause)}); nothing was restored: load it with restore_rng=False to resume "
                "without it (then not bit-identical)"
            ) from err
    try:
        incompatible = module.load_state_dict(payload["model"], strict=strict)
        for component, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
            if component is not None:
                component.load_state_dict(payload[key])
    except BaseException as err:  # a module's own load hook refused what the checks let through
        if before is not None:
            load_rng_state_dict(before)
        err.add_note(f"while loading checkpoint {loaded_from}, after its checks passed: the model may be partly loaded")
        raise
    return LoadedCheckpoint(
        path=loaded_from,
        epoch=payload.get("epoch"),
        step=payload.get("step"),
        extra=dict(payload.get("extra") or {}),
        missing_keys=list(incompatible.missing_keys),
        unexpected_keys=list(incompatible.unexpected_keys),
        skipped=skipped,
    )
