"""Checks for the exercises of notebook 01 · tensors (``notebooks/src/01_tensors.py``).
Used by notebook 01, whose ``Checker("01")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import torch

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import python_loops, refers_to, torch_calls

EXERCISES = Registry("01")
TYPES = "2. Data types (数据类型)"
SHAPES = "3. Dimensions and shapes (维度与尺寸)"
LAYOUT = "4. Memory layout: storage, strides, views (存储、步长与视图)"
BROADCASTING = "7. Broadcasting (广播) and matrix products (矩阵乘法)"

DISTANCE_LIBRARIES = (
    "cdist",
    "_cdist_forward",  # what torch.cdist runs (torch.ops.aten._cdist_forward)
    "_euclidean_dist",  # torch.ops.aten._euclidean_dist, the same for p = 2
    "pairwise_distances",
    "euclidean_distances",
    "distance_matrix",
)
"""Library functions that compute every pairwise distance at once: exercise 3 asks for it by broadcasting."""


def _operations(fn, *args) -> int:
    """How many torch operations ``fn(*args)`` runs (a loop over points runs more for more points)."""
    with torch_calls() as calls:
        fn(*args)
    return sum(calls.values())


@EXERCISES.exercise(1, "Predict shapes and strides (predict)", f"{SHAPES}; {LAYOUT}")
def shapes_and_strides(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 3,
        "give a list of three tuples: [shape of a, shape of b, strides of c]",
    )
    a, b, c = (tuple(v) if isinstance(v, (list, tuple)) else v for v in answer)
    expect(all(isinstance(v, tuple) for v in (a, b, c)), "write each answer as a tuple of ints, e.g. (2, 4)")
    if a == (2, 1, 4) and b == (2, 4):
        hint(
            "the shapes of a and b are swapped: `keepdim=True` keeps the reduced dimension with size 1, without it the "
            "dimension is removed",
            SHAPES,
        )
    expect(a == (2, 4), "shape of a: `sum(dim=1)` removes dimension 1 of (2, 3, 4)", SHAPES)
    expect(b == (2, 1, 4), "shape of b: `keepdim=True` keeps dimension 1, with size 1", SHAPES)
    if c == (4, 12, 1) or c == (3, 4, 12):
        hint(
            "strides of c: a transpose does not move data and does not recompute the strides: it swaps the strides "
            "of the two dimensions it exchanges and keeps the other. Which two does `transpose(0, 2)` exchange?",
            LAYOUT,
        )
    expect(
        c == (1, 4, 12),
        "strides of c: first work out the strides of x, which is contiguous (each stride is the product of the "
        "sizes to its right), then apply what a transpose does to strides",
        LAYOUT,
    )


@EXERCISES.exercise(2, "Channels-last, flattened (write a function)", LAYOUT)
def channels_last_flat(fn):
    if loops := python_loops(fn):
        hint(
            f"your answer uses {loops[0]}: copying pixel by pixel (or channel by channel) gives the right numbers, "
            "slowly, and skips this section's point: moving a dimension is only a change of strides, and one "
            "reshape then merges H and W. Write it without a loop"
        )
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 4, 5, generator=g)  # N, C, H, W with all sizes different
    try:
        out = returns(fn, images)
    except RuntimeError as err:
        if "view size is not compatible" in str(err) and refers_to(fn, "transpose", "swapaxes", "mT"):
            hint(
                "`view` refused the transposed tensor, and `reshape` would not fix the real problem: "
                "`transpose(1, 3)` gives (N, W, H, C), with W before H, so the pixels would come out in the wrong "
                "order. Move C last while keeping H before W, then merge H and W"
            )
        raise
    expect(isinstance(out, torch.Tensor), f"return a tensor, not a {type(out).__name__}")
    expect(
        tuple(out.shape) == (2, 20, 3),
        f"the result should have shape (N, H*W, C) = (2, 20, 3), not {tuple(out.shape)}",
        SHAPES,
    )
    expected = images.permute(0, 2, 3, 1).reshape(2, 20, 3)
    if torch.equal(out, images.reshape(2, 20, 3)):
        hint(
            "the shape is right but the numbers are in the wrong places: `reshape` reads the tensor in its "
            "current order (C, H, W) and never moves a dimension. Move C last with `permute` first"
        )
    if torch.equal(out, images.permute(0, 3, 2, 1).reshape(2, 20, 3)):
        hint(
            "H and W are swapped: your pixel (h, w) lands at out[n, w * H + h, c]. `transpose(1, 3)` (or "
            "`permute(0, 3, 2, 1)`) gives (N, W, H, C); `permute(0, 2, 3, 1)` moves C last and keeps H before W"
        )
    expect(out.dtype == images.dtype, f"keep the dtype: got {out.dtype}, expected {images.dtype}", TYPES)
    expect(
        torch.equal(out, expected),
        "some values are in the wrong places: pixel (h, w) of channel c should land at out[n, h * W + w, c]",
    )
    single = returns(fn, images[:1].contiguous())
    expect(
        tuple(single.shape) == (1, 20, 3),
        "a batch of one image should give shape (1, 20, 3): do not hard-code the sizes, read them from `images.shape`",
    )
    other = torch.randn(3, 2, 5, 7, generator=g)  # every size different from the first batch's
    hard_coded = (
        "right for (2, 3, 4, 5) images but not for a (3, 2, 5, 7) batch, which should give shape (3, 35, 2): "
        "do not hard-code the sizes, read them from `images.shape` (or let `flatten` work them out)"
    )
    try:
        out = returns(fn, other)
    except RuntimeError as err:
        if "is invalid for input of size" in str(err):
            hint(f"{hard_coded}. Your `reshape` or `view` refused it: {err}", SHAPES)
        raise
    expect(
        isinstance(out, torch.Tensor) and torch.equal(out, other.permute(0, 2, 3, 1).reshape(3, 35, 2)),
        hard_coded,
        SHAPES,
    )
    few, more = _operations(fn, images), _operations(fn, other)
    expect(
        few == more,
        f"your function runs {few} tensor operations for (2, 3, 4, 5) images and {more} for (3, 2, 5, 7): their "
        "number grows with the sizes, so a loop (or a recursion) runs somewhere the check cannot read (code in "
        "a string run by `exec`, a function defined elsewhere). A loop skips this section's point: moving a "
        "dimension is only a change of strides, and one reshape then merges H and W",
    )


@EXERCISES.exercise(3, "Nearest neighbours by broadcasting (stretch)", BROADCASTING)
def nearest(fn):
    if loops := python_loops(fn):
        hint(
            f"your answer uses {loops[0]}: a loop runs one small tensor operation per point (or per pair), a "
            "million of them for 1,000 × 1,000 points, where broadcasting runs one. Broadcasting is what this "
            "exercise practises: give `a` and `b` one new axis each, with `None`, so that a single subtraction "
            "covers every pair, then reduce"
        )
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 3, generator=g), torch.randn(7, 3, generator=g)
    with torch_calls() as calls:
        result = returns(fn, a, b)
    if library := refers_to(fn, *DISTANCE_LIBRARIES) or next((f for f in DISTANCE_LIBRARIES if calls[f]), None):
        hint(
            f"`{library}` computes all the distances for you: the right tool in real code, but it skips what "
            "this exercise practises, broadcasting two sets of points against each other. Write the distances "
            f"with broadcasting and a reduction (then use `{library}` to check them)"
        )
    expect(isinstance(result, tuple) and len(result) == 2, "return a pair: (squared distances, indices)")
    d, idx = result
    if isinstance(idx, tuple) and hasattr(idx, "indices"):
        hint(
            "your idx is the pair (values, indices) that `min(dim=1)` returns: take its `.indices`, or use "
            "`argmin(dim=1)`"
        )
    expect(isinstance(d, torch.Tensor) and isinstance(idx, torch.Tensor), "return two tensors")
    if tuple(d.shape) == (7, 5):
        hint(
            "your d has shape (7, 5): rows should be the points of `a`, so put the new axis of `a` at dim 1 and "
            "that of `b` at dim 0"
        )
    if tuple(d.shape) == (5, 7, 3):
        hint("your d still has the coordinate dimension: sum the squared differences over the last dimension")
    expect(
        tuple(d.shape) == (5, 7),
        f"the squared distances d should have shape (5, 7) (one row per point of a), not {tuple(d.shape)}",
    )
    expect(d.dtype == a.dtype, f"keep the dtype of a and b ({a.dtype}) for d, not {d.dtype}", TYPES)
    expected = torch.cdist(a, b) ** 2
    if torch.allclose(d, expected.sqrt(), atol=1e-4):
        hint("these are distances, not squared distances: do not take the square root")
    expect(
        torch.allclose(d, expected, atol=1e-4),
        "the values of d are wrong: d[i, j] should be ((a[i] - b[j]) ** 2).sum()",
    )
    expect(idx.dtype == torch.int64, f"indices should be int64 (what argmin returns), not {idx.dtype}", TYPES)
    if tuple(idx.shape) == (7,):
        hint("your idx has one entry per point of b: take the argmin along dim=1, over the points of b")
    expect(
        tuple(idx.shape) == (5,),
        f"the indices idx should have shape (5,), one index per point of a, not {tuple(idx.shape)}",
        SHAPES,
    )
    expect(
        torch.equal(idx, expected.argmin(dim=1)),
        "the indices are wrong: idx[i] should be the index of the point of b nearest to a[i]",
    )
    small, large = _operations(fn, a[:4], b[:3]), _operations(fn, a, b)
    expect(
        small == large,
        f"your function runs {small} tensor operations for 4 × 3 points and {large} for 5 × 7: their number grows "
        "with the number of points, so a Python loop runs somewhere (perhaps in a function the check cannot read). "
        "Broadcasting handles every pair in a fixed number of operations",
    )
    big_a, big_b = torch.randn(300, 8, generator=g), torch.randn(400, 8, generator=g)
    d_big, _ = returns(fn, big_a, big_b)
    expect(
        torch.allclose(d_big, torch.cdist(big_a, big_b) ** 2, atol=1e-3),
        "right on small inputs but not on (300, 8) and (400, 8): do not hard-code sizes",
    )
