"""Checks for the exercises of notebook 02 · autograd (``notebooks/src/02_autograd.py``).
Used by notebook 02, whose ``Checker("02")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import re

import torch
import torch.nn.functional as F

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import autograd_runs, global_values, refers_to, torch_calls

EXERCISES = Registry("02")

VJP = "3. `backward()` on a non-scalar: the `gradient` argument"
ACCUMULATE = "4. The graph is freed; gradients accumulate (梯度累加)"
FUNCTIONS = "6. Custom Functions (自定义算子)"
GRADCHECK = "7. Checking a Function: `gradcheck` and `gradgradcheck` (梯度检查)"
BROADCASTING = "01 · 7. Broadcasting (广播) and matrix products (矩阵乘法)"
INTERMEDIATES = "Saving intermediate results: the double-backward trap"

AUTOGRAD_NAMES = (
    "autograd.grad",
    "autograd.backward",
    "func.vjp",
    "func.grad",
    "func.jvp",
    "functional.vjp",
    "functional.jacobian",
    "jacrev",
    "jacfwd",
    "forward_ad",
    "enable_grad",
    "set_grad_enabled",
)
"""Ways to ask autograd for a gradient, by name: exercise 3 (and exercise 2's backward) compute it by hand. Names a
learner may give a variable (``vjp``, ``jacobian``, ``backward``) are left out: a run of the autograd engine is
counted while the answer runs, however it was called."""

LIBRARY_SOFTPLUS = {
    "softplus": "PyTorch's own softplus (`F.softplus` or `nn.Softplus`)",
    "logaddexp": "`torch.logaddexp`, and logaddexp(x, 0) = log(exp(x) + 1) is softplus under another name",
    "log_sigmoid": "`F.logsigmoid`, and -logsigmoid(-x) = log(1 + exp(x)) is softplus under another name",
    "log_sigmoid_forward": "`log_sigmoid_forward`, the operator behind `F.logsigmoid` (-logsigmoid(-x) is softplus)",
}
"""Library functions (by the name ``torch_calls`` counts) that compute softplus: exercise 2 writes it by hand."""


def _holds_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple, set)):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


def _numbers(value, name):
    """A list of three floats from a list, tuple or tensor, or a hint."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    expect(
        isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value),
        f"{name}: write the three numbers of x.grad as a list, e.g. [1.0, 2.0, 3.0]",
    )
    return torch.tensor([float(v) for v in value], dtype=torch.float64)


@EXERCISES.exercise(1, "Predict a vector–Jacobian product, then an accumulation (predict)", VJP)
def predict_vjp(answer):
    if isinstance(answer, torch.Tensor):  # a (2, 3) tensor is as good as two lists
        answer = answer.tolist()
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 2,
        "give a list of two lists: [x.grad after the first backward, x.grad after the second]",
    )
    aliased = answer[0] is answer[1] and isinstance(answer[0], torch.Tensor)
    first, second = _numbers(answer[0], "first"), _numbers(answer[1], "second")
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    g = torch.tensor([1.0, 0.0, -2.0], dtype=torch.float64)
    s = x.sum()
    right = g * s + (g * x).sum()  # (g^T J)_j = sum_i g_i (delta_ij s + x_i)

    def same(a, b):
        return torch.allclose(a, b, atol=1e-6)

    if aliased or (same(first, second) and same(second, right + 2 * x)):
        hint(
            "first and second are the same numbers: x.grad is one tensor that every backward updates in place, "
            "so a `first = x.grad` kept without `.tolist()` (or `.clone()`) changed when the second backward added "
            "to it. Keep a copy of the first result before the second backward",
            ACCUMULATE,
        )
    if same(first, g * s):
        hint(
            "first: you treated y = x * x.sum() as element-wise (a diagonal Jacobian). But x.sum() depends on "
            "every x_j too, so every y_i depends on every x_j: apply the product rule to x_i * x.sum()"
        )
    if same(first, torch.full((3,), 2 * s.item(), dtype=torch.float64)):
        hint(
            "first: that is the gradient of y.sum() (gradient = ones); the vector is [1, 0, -2], and it "
            "weights each y_i"
        )
    if same(first, g * s + x * g.sum()):
        hint(
            "first: you computed J g (a Jacobian-vector product). backward computes g^T J: "
            "x.grad[j] = sum over i of g[i] * dy_i/dx_j"
        )
    expect(
        same(first, right),
        "first: x.grad[j] = sum over i of g[i] * dy_i/dx_j. Write the Jacobian dy_i/dx_j first: y_i = x_i * "
        "x.sum() is a product, and the product rule gives one term where x_j is x_i (only when i = j) and one "
        "where x_j is inside the sum (for every i)",
    )
    if same(second, 2 * x):
        hint("second: backward does not reset x.grad. The new gradient 2x is added to what was there", ACCUMULATE)
    expect(
        same(second, right + 2 * x),
        "second: x.grad keeps the first result and adds the gradient of (x ** 2).sum(), which is 2x",
        ACCUMULATE,
    )


@EXERCISES.exercise(2, "A numerically stable Softplus Function (write a Function)", FUNCTIONS)
def softplus_function(cls):
    expect(
        isinstance(cls, type) and issubclass(cls, torch.autograd.Function),
        "pass the class itself (`Softplus`), a subclass of torch.autograd.Function",
    )
    x = torch.tensor([-100.0, -20.0, -3.0, -0.5, 0.0, 0.5, 3.0, 20.0, 100.0], requires_grad=True)
    try:
        with torch_calls() as calls:
            y = cls.apply(x)
    except (RuntimeError, TypeError) as err:
        if any(m in str(err) for m in ("Boolean value of Tensor", "concatenate tuple", "maximum(): argument")):
            hint(
                "element by element, max(x, 0) is `x.clamp(min=0)` (or `torch.relu(x)`, or `torch.maximum(x, "
                "torch.zeros_like(x))`): Python's `max` compares whole tensors, `torch.max(x, 0)` is a reduction "
                "over dim 0 that returns (values, indices), and `torch.maximum` wants two tensors"
            )
        raise
    expect(isinstance(y, torch.Tensor), f"forward should return a tensor, not a {type(y).__name__}")
    if library := next((name for key, name in LIBRARY_SOFTPLUS.items() if calls[key]), None):
        hint(
            f"forward calls {library}, the function this exercise asks you to write: the point is to see where "
            "log(1 + exp(x)) overflows and to write the stable formula yourself, with max, log1p and exp"
        )
    on_ctx = sorted(k for k, v in getattr(y.grad_fn, "__dict__", {}).items() if _holds_tensor(v))
    if on_ctx:
        hint(
            f"forward keeps a tensor as an attribute of ctx (`ctx.{on_ctx[0]}`): tensors for backward go through "
            "`ctx.save_for_backward`, which records each tensor's version counter, so that backward raises if "
            "the tensor was changed in place in between instead of silently using the new numbers, and which "
            "avoids a reference cycle (output → ctx → output) that keeps the graph in memory. Attributes of ctx "
            "are for non-tensors, like GradCoeff's coeff"
        )
    outside = sorted(k for k, v in global_values(cls.backward).items() if _holds_tensor(v))
    if outside:
        hint(
            f"backward reads the tensor `{outside[0]}` from outside the Function: a global is shared by every "
            "call, so a second forward overwrites what the first one's backward needs. Save what backward needs "
            "with `ctx.save_for_backward` in forward"
        )
    expect(tuple(y.shape) == tuple(x.shape), f"forward should keep the shape {tuple(x.shape)}, not {tuple(y.shape)}")
    expect(y.dtype == x.dtype, f"forward should keep the dtype {x.dtype}, not {y.dtype}")
    reference = F.softplus(x.detach())
    if not torch.isfinite(y).all():
        hint(
            "forward gives inf or nan for large inputs: exp(100) overflows float32 (its largest value is about "
            "3.4e38 = exp(88.7)). Use the identity max(x, 0) + log1p(exp(-|x|)), whose exp never overflows"
        )
    expect(
        torch.allclose(y.detach(), reference, rtol=1e-5, atol=1e-6),
        "forward's values differ from F.softplus: softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))",
    )
    upstream = torch.linspace(-2.0, 2.0, x.numel())  # not all ones: the chain rule must use it
    with autograd_runs() as runs, torch_calls() as calls:
        (gx,) = torch.autograd.grad(y, x, upstream)
    if calls["softplus_backward"] or refers_to(cls.backward, "softplus_backward"):
        hint(
            "backward calls PyTorch's own `softplus_backward` (`torch.ops.aten.softplus_backward`), the derivative "
            "this exercise asks you to write: writing it yourself is the point of a custom Function's backward. "
            "The derivative of softplus is sigmoid(x): multiply it by grad_output"
        )
    if runs[0] > 1 or calls["softplus"] or refers_to(cls.backward, *AUTOGRAD_NAMES):
        hint(
            "backward asks autograd for the derivative: writing it yourself is the point of a custom Function (its "
            "backward is what autograd runs, for operations it cannot differentiate or should not). The derivative "
            "of softplus is sigmoid(x): multiply it by grad_output"
        )
    expect(
        gx is not None and tuple(gx.shape) == tuple(x.shape),
        "backward should return one gradient shaped like the input",
    )
    if not torch.isfinite(gx).all():
        hint(
            "backward gives inf or nan for large inputs: exp(100) overflows float32 to inf, so exp(x) / (1 + "
            "exp(x)) is inf / inf = nan at x = 100. The derivative is sigmoid(x), at most 1: torch.sigmoid(x) "
            "computes it as 1 / (1 + exp(-x)), where an overflow of exp only gives 1 / inf = 0"
        )
    sig = torch.sigmoid(x.detach())
    if torch.allclose(gx, sig, atol=1e-6):
        hint(
            "backward returns the derivative sigmoid(x) alone: multiply it by grad_output (the chain rule: "
            "dL/dx = dL/dy * dy/dx)"
        )
    if torch.allclose(gx, upstream * torch.sigmoid(reference), atol=1e-6):
        hint(
            "backward evaluates sigmoid at the output: the derivative is sigmoid(x) of the *input*. If you saved "
            "the output y, sigmoid(x) = 1 - exp(-y)"
        )
    expect(
        torch.allclose(gx, upstream * sig, rtol=1e-5, atol=1e-6),
        "backward's gradient is wrong: it should be grad_output * sigmoid(x)",
    )
    gen = torch.Generator().manual_seed(2)
    for n in (1, 7):
        x64 = (torch.rand(n, 3, generator=gen, dtype=torch.float64) * 12 - 6).requires_grad_()
        expect(
            torch.autograd.gradcheck(cls.apply, (x64,), raise_exception=False),
            "gradcheck fails in float64: backward does not match the numerical derivative",
            GRADCHECK,
        )
        if not torch.autograd.gradgradcheck(cls.apply, (x64,), raise_exception=False):
            y64 = cls.apply(x64)
            saved = y64.grad_fn.saved_tensors if y64.grad_fn is not None else ()
            if any(not (t is x64 or torch.equal(t, x64) or torch.equal(t, y64)) for t in saved):
                hint(
                    "gradcheck passes but gradgradcheck fails: forward saves an intermediate result (neither the "
                    "input nor the output). Autograd does not know how it depends on the input, so the second "
                    "derivative treats it as a constant. Save the input (or the output) and recompute the rest in "
                    "backward",
                    INTERMEDIATES,
                )
            hint(
                "gradcheck passes but gradgradcheck fails: the backward is not differentiable. Write it with "
                "PyTorch operations on the saved tensors (no @once_differentiable, .detach(), .item() or NumPy)",
                GRADCHECK,
            )


_MATRIX_ONLY = (
    r"t\(\) expects a tensor with <= 2 dimensions|self must be a matrix|must match the size of tensor|"
    r"Expected size for first two dimensions|shapes cannot be multiplied|must be a matrix|batch1 must be a 3D"
)
"""What the 2-D formulas of ``LinearFunction`` (``grad_out.t().mm(x)``, ``grad_out.mm(weight)``) raise on 3-D input."""


def _reference_linear_grads(x, weight, bias, grad_out):
    x, weight, bias = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    return torch.autograd.grad(F.linear(x, weight, bias), (x, weight, bias), grad_out)


@EXERCISES.exercise(3, "The backward of a linear layer, for any batch shape (stretch)", FUNCTIONS)
def linear_backward(fn):
    gen = torch.Generator().manual_seed(3)
    n_in, n_out = 4, 3
    for lead in ((5,), (2, 5), (3, 2, 4)):  # a batch; a batch of sequences; one more dimension
        x = torch.randn(*lead, n_in, generator=gen)
        weight, bias = torch.randn(n_out, n_in, generator=gen), torch.randn(n_out, generator=gen)
        grad_out = torch.randn(*lead, n_out, generator=gen)
        try:
            with torch.no_grad(), autograd_runs() as runs:  # the backward is written by hand, as in a Function
                result = returns(fn, x, weight, bias, grad_out)
        except RuntimeError as err:
            if "does not require grad" in str(err) or "does not have a grad_fn" in str(err):
                hint(
                    "autograd is off during this check: compute the three gradients with tensor operations "
                    "(matrix products and sums), not with backward() or torch.autograd.grad"
                )
            if x.dim() == 2 and "shapes cannot be multiplied" in str(err):
                hint(
                    f"for x of shape {tuple(x.shape)} your code raised “{str(err).splitlines()[0]}”. Write down the "
                    f"shape of each operand: grad_out is (..., out) = {tuple(grad_out.shape)}, weight is (out, in) = "
                    f"{tuple(weight.shape)}, x is (..., in). Which product of two of them has the shape of the "
                    "gradient you want?"
                )
            if x.dim() > 2 and re.search(_MATRIX_ONLY, str(err)):
                hint(
                    f"for x of shape {tuple(x.shape)} your code raised “{str(err).splitlines()[0]}”: section 6's "
                    "2-D formulas (`t()`, `mm`) take matrices. Every leading position is a row where the same "
                    "weight was used: flatten the leading dimensions into one, and the 2-D formulas apply"
                )
            raise
        if runs[0] or refers_to(fn, *AUTOGRAD_NAMES):
            hint(
                "your function asks autograd for the gradients: this exercise is the "
                "backward you write when autograd cannot help (a custom Function's backward), and the rule it "
                "practises, that a tensor used at many positions receives the sum of their gradients, is what "
                "autograd would do for you out of sight. Compute them with tensor operations"
            )
        expect(
            isinstance(result, (tuple, list)) and len(result) == 3,
            "return a tuple of three tensors: (grad_x, grad_weight, grad_bias)",
        )
        gx, gw, gb = result
        expect(all(isinstance(t, torch.Tensor) for t in result), "return three tensors")
        want_x, want_w, want_b = _reference_linear_grads(x, weight, bias, grad_out)
        shape = f"for x of shape {tuple(x.shape)}"
        expect(
            tuple(gx.shape) == tuple(x.shape),
            f"{shape}, grad_x should have x's shape {tuple(x.shape)}, not "
            f"{tuple(gx.shape)}: grad_x = grad_out @ weight",
        )
        if tuple(gw.shape) == (n_in, n_out):
            hint(
                f"{shape}, grad_weight has shape {tuple(gw.shape)}, the transpose of weight's (out, in) = "
                f"{(n_out, n_in)}: it is grad_out^T x, not x^T grad_out"
            )
        if tuple(gw.shape) == (*lead[:-1], n_out, n_in) and len(lead) > 1:
            hint(
                f"{shape}, grad_weight has shape {tuple(gw.shape)}: one weight is used at every position of the "
                f"leading dimensions {lead}, so its gradient is the sum over all of them, not over the last one "
                "only. Flatten the leading dimensions first, or sum over every one",
                BROADCASTING,
            )
        expect(
            tuple(gw.shape) == (n_out, n_in),
            f"{shape}, grad_weight should have weight's shape {(n_out, n_in)}, not {tuple(gw.shape)}",
        )
        if tuple(gb.shape) == tuple(lead) and lead[-1] != n_out:
            hint(
                f"{shape}, grad_bias has shape {tuple(gb.shape)}, the leading dimensions: you summed grad_out over "
                "its last dimension, the outputs. The bias has one entry per output: sum over every *other* "
                "dimension",
                BROADCASTING,
            )
        if tuple(gb.shape) != (n_out,) and gb.numel() > n_out:
            hint(
                f"{shape}, grad_bias has shape {tuple(gb.shape)}: the bias was broadcast over every leading "
                f"dimension {lead}, so its gradient sums grad_out over all of them, whatever their number",
                BROADCASTING,
            )
        expect(
            tuple(gb.shape) == (n_out,),
            f"{shape}, grad_bias should have bias's shape ({n_out},), not {tuple(gb.shape)}",
        )
        for name, got, want in (("grad_x", gx, want_x), ("grad_weight", gw, want_w), ("grad_bias", gb, want_b)):
            expect(got.dtype == want.dtype, f"{name} should be {want.dtype}, like the inputs, not {got.dtype}")
        expect(
            torch.allclose(gx, want_x, rtol=1e-4, atol=1e-5),
            f"{shape}, grad_x has the right shape but wrong values: it is grad_out @ weight",
        )
        expect(
            torch.allclose(gw, want_w, rtol=1e-4, atol=1e-5),
            f"{shape}, grad_weight has the right shape but "
            "wrong values: it is the sum over every leading position of outer(grad_out, x)",
        )
        expect(
            torch.allclose(gb, want_b, rtol=1e-4, atol=1e-5),
            f"{shape}, grad_bias has the right shape but "
            "wrong values: it is grad_out summed over every leading dimension",
        )
