"""A short, stable printer for tensors. Used by notebooks 01, 02, 03, 04, 06, 07 and 10.

``print(tensor)`` is fine for small exact values, but floating-point results can differ in the
last digits between machines (other CPUs, other BLAS kernels). Notebooks print computed floats
through :func:`show`, which rounds to a fixed number of decimals, removes negative zeros, and
states shape, dtype and device on one line, so that stored outputs stay comparable.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def fmt(value: Any, decimals: int = 4) -> str:
    """Format a tensor, array or number with ``decimals`` fixed decimals.

    Integers and booleans are printed exactly. Floating values are rounded half-to-even and
    ``-0`` is printed as ``0``. Nested structure is kept (``[[1.0000, 2.0000], ...]``).

    Raises:
        TypeError: ``value`` is not a tensor, array, number or (nested) list of numbers.
        ValueError: ``decimals`` is negative.
    """
    if isinstance(decimals, bool) or not isinstance(decimals, int):
        raise TypeError(f"decimals must be an int, got {type(decimals).__name__}")
    if decimals < 0:
        raise ValueError(f"decimals must be >= 0, got {decimals}")
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.is_complex():
            raise TypeError("fmt() does not format complex tensors")
        if t.dtype.is_floating_point:
            t = t.double()  # bfloat16/float16 have no numpy dtype; the values are exact in float64
        arr = t.numpy()
    elif isinstance(value, (np.ndarray, np.generic, int, float, bool, list, tuple)):
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"fmt() expects numbers, got {type(value).__name__} of dtype {arr.dtype}")
    else:
        raise TypeError(f"fmt() expects a tensor, array or number, got {type(value).__name__}")
    if arr.dtype.kind == "f":
        arr = np.round(arr.astype(np.float64), decimals) + 0.0  # + 0.0 turns -0.0 into 0.0
        return np.array2string(
            arr,
            formatter={"float_kind": lambda x: f"{x:.{decimals}f}"},
            separator=", ",
            max_line_width=100,
            threshold=200,
        )
    return np.array2string(arr, separator=", ", max_line_width=100, threshold=200)


def show(value: Any, name: str | None = None, decimals: int = 4) -> None:
    """Print ``name: shape dtype device`` and the rounded values of a tensor.

    Non-tensors (arrays, numbers) are printed rounded, with their Python type.

    Example::

        >>> show(torch.tensor([1/3, -1e-9]), "x")
        x: shape=(2,) dtype=float32 device=cpu
        [0.3333, 0.0000]
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    prefix = f"{name}: " if name else ""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        header = f"{prefix}shape={tuple(value.shape)} dtype={dtype} device={value.device.type}"
        if value.requires_grad:
            header += " requires_grad=True"
        print(header)
    else:
        print(f"{prefix}{type(value).__name__}")
    print(fmt(value, decimals))


def show_warning(fn: Callable[[], Any], category: type[Warning], match: str) -> Any:
    """Run ``fn()``, print the ``category`` warning it raises (name and first sentence), return its result.

    For cells whose lesson is a warning (notebooks 01, 02, 03, 04 and 06): the learner reads the warning's
    text in the output, and the call fails (``AssertionError``) if that warning is no longer raised. Inside
    the call every warning is recorded, whatever the filters (``make test`` turns FutureWarnings into errors).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    found = [w for w in caught if issubclass(w.category, category) and match in str(w.message)]
    if not found:
        raise AssertionError(
            f"expected a {category.__name__} containing {match!r}, got "
            f"{[f'{w.category.__name__}: {w.message}' for w in caught]}"
        )
    first = str(found[0].message).split(". ")[0].rstrip(".")
    print(f"{found[0].category.__name__}: {first}.")
    return result
