"""Choosing the device a notebook runs on. Used by every notebook.

The order is CUDA, then Apple's MPS, then the CPU. A reader can force a device with the
environment variable ``TORCH_COURSE_DEVICE`` (for example ``TORCH_COURSE_DEVICE=cpu make lab``);
``make test`` and ``make execute`` set it to ``cpu`` so that stored outputs are made on the CPU.
"""

from __future__ import annotations

import os

import torch

DEVICE_ENV_VAR = "TORCH_COURSE_DEVICE"
_KNOWN = ("cpu", "cuda", "mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def get_device(prefer: str | None = None) -> torch.device:
    """Return the best available device, or the one asked for.

    Args:
        prefer: ``"cuda"``, ``"cuda:1"``, ``"mps"`` or ``"cpu"``. When ``None`` the environment
            variable ``TORCH_COURSE_DEVICE`` is read; when that is unset or empty the first
            available of CUDA, MPS and CPU is chosen.

    Raises:
        TypeError: ``prefer`` is not a string.
        ValueError: the device type is unknown, or it was asked for but is not available
            (a clear message rather than a crash deep inside the first ``.to(device)``).
    """
    if prefer is None:
        prefer = os.environ.get(DEVICE_ENV_VAR, "").strip() or None
        source = f"environment variable {DEVICE_ENV_VAR}"
    else:
        source = "argument prefer"
    if prefer is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if not isinstance(prefer, str):
        raise TypeError(f"get_device(prefer=...) expects a string such as 'cpu', got {type(prefer).__name__}")
    try:
        device = torch.device(prefer.lower())
    except RuntimeError as err:
        raise ValueError(f"{source}={prefer!r} is not a device; use one of {', '.join(_KNOWN)}") from err
    if device.type not in _KNOWN:
        raise ValueError(f"{source}={prefer!r}: device type {device.type!r} is not one of {', '.join(_KNOWN)}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{source}={prefer!r} but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{source}={prefer!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    if device.type == "mps" and not _mps_available():
        raise ValueError(f"{source}={prefer!r} but Apple MPS is not available on this machine")
    return device
