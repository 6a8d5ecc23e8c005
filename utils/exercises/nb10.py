"""Checks for the exercises of notebook 10 · modules and optimizers (``notebooks/src/10_modules_and_optimizers.py``).
Used by notebook 10, whose ``Checker("10")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import copy
import importlib
import math
import numbers
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, TensorDataset

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import assigned_names, calls_to, counting_calls, refers_to, torch_calls

_adam = importlib.import_module("torch.optim.adam")  # the module; `torch.optim.adam` names the function

EXERCISES = Registry("10")

S_STATE = "1.1 Where a module keeps its state"
S_LIST = "1.2 `ModuleList` and `Sequential` versus a Python list"
S_DROPOUT = "1.7 `train()` and `eval()`: Dropout"
S_LAYERNORM = "1.9 LayerNorm by hand, and biased versus unbiased variance"
S_ADAM = "2.3 Adam, written by hand"
S_ADAMW = "2.4 Weight decay: L2 in the loss, or decoupled (AdamW)"
S_STATE_DICT = "2.5 What `optimizer.state` holds, and `add_param_group`"
S_DECAY = "2.7 No weight decay for biases and normalisation weights"
S_LAMBDA = "3.1 Learning-rate schedulers: `LambdaLR`"
S_WARMUP = "3.2 Chained schedulers, warm-up, cosine, one-cycle"
S_LOOP = "04 · 13. The training loop, written out"


@EXERCISES.exercise(1, "Count what a module registers (predict)", f"{S_STATE}; {S_LIST}")
def counts(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 4,
        "give a list of four numbers: [parameter count, number of buffers, number of state_dict keys, "
        "value of a Dropout survivor]",
    )
    expect(
        all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in answer),
        "write each answer as a number, e.g. [10, 2, 5, 1.5]",
    )
    n_params, n_buffers, n_keys, survivor = answer
    if n_params == 72:
        hint(
            "1: you counted the Linear in `self.extra`: a plain Python list is not a Module, so `__setattr__` "
            "does not register the layer inside it",
            S_LIST,
        )
    if n_params == 44:
        hint("1: BatchNorm1d(4) has learnable parameters too: a weight and a bias of 4 numbers each", S_STATE)
    if n_params == 48:
        hint("1: `self.scale = nn.Parameter(...)` is a parameter of 4 numbers", S_STATE)
    expect(
        n_params == 52,
        "1: count the numbers (`numel()`) of every tensor that `parameters()` yields: the parameters of each "
        "registered submodule and the `nn.Parameter`s assigned to the module itself, nothing that a plain "
        "attribute holds",
        S_STATE,
    )
    if n_buffers == 5:
        hint(
            "2: `self.offset = torch.zeros(4)` is a plain attribute, not a buffer: only `register_buffer` makes one",
            S_STATE,
        )
    if n_buffers == 3:
        hint(
            "2: one buffer is missing: either `mask` (persistent=False keeps it out of `state_dict`, not out "
            "of `buffers()`) or BatchNorm's third buffer, the counter `num_batches_tracked` (notebook 06, §1)",
            S_STATE,
        )
    expect(
        n_buffers == 4,
        "2: BatchNorm1d has three buffers (running_mean, running_var, num_batches_tracked) "
        "and the module registers one more",
        S_STATE,
    )
    if n_keys == 11:
        hint(
            "3: `mask` was registered with persistent=False: it is a buffer, but `state_dict()` leaves it out", S_STATE
        )
    if n_keys == 9:
        hint(
            "3: one persistent buffer is missing: BatchNorm's counter `num_batches_tracked` is in `state_dict()` "
            "too (notebook 06, §1)",
            S_STATE,
        )
    if n_keys == 7:
        hint(
            "3: `state_dict()` holds the persistent buffers too (BatchNorm's running statistics and counter), "
            "not only the parameter tensors",
            S_STATE,
        )
    expect(
        n_keys == 10,
        "3: `state_dict()` has one key per parameter tensor (not per number) plus one per persistent buffer",
        S_STATE,
    )
    if math.isclose(survivor, 1.0):
        hint(
            "4: in training mode Dropout rescales the survivors by 1/(1 − p) (inverted dropout), so that the "
            "expected value is unchanged",
            S_DROPOUT,
        )
    if math.isclose(survivor, 0.8, abs_tol=1e-3):
        hint(
            "4: multiplying by 1 − p is the old convention, applied at test time; PyTorch divides the "
            "survivors by 1 − p during training instead",
            S_DROPOUT,
        )
    expect(
        math.isclose(survivor, 1.25, abs_tol=1e-3), "4: survivors are multiplied by 1/(1 − p) with p = 0.2", S_DROPOUT
    )


def _layer_norm_cases(cls):
    g = torch.Generator().manual_seed(10)
    for shape, eps in (((4, 6), 1e-5), ((2, 3, 5), 1e-5), ((3, 8), 0.1)):
        c = shape[-1]
        module = cls(c, eps=eps)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        x = torch.randn(shape, generator=g) * 3 + 1
        yield module, x, eps


NORM_MODULES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)
"""Library normalisation layers: MyLayerNorm must not be one, nor hold one."""
NORM_NAMES = (
    "layer_norm",
    "LayerNorm",
    "native_layer_norm",
    "group_norm",
    "GroupNorm",
    "batch_norm",
    "BatchNorm1d",
    "instance_norm",
    "rms_norm",
    "RMSNorm",
)
"""Library normalisations, by name in the source: each computes the whole formula (rms_norm of x − mean, or
batch_norm of the transposed input, is layer_norm too)."""
NORM_CALLS = {
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "native_group_norm",
    "batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "instance_norm",
    "rms_norm",
    "_fused_rms_norm",
}
"""The same, as torch functions actually called (however they were reached)."""
WRITE_THE_FORMULA = (
    "write the formula of section 1.9 yourself (mean, biased variance, eps inside the square root, weight and "
    "bias); the exercise practises turning it into a module whose parameters are registered, and the library "
    "call would compute the whole answer for you. Compare with nn.LayerNorm afterwards"
)


def _no_library_norm(cls):
    """Hint when MyLayerNorm is, holds, names or calls a library normalisation."""
    if isinstance(cls, type) and issubclass(cls, NORM_MODULES):
        library = next(c for c in cls.__mro__ if c.__module__.startswith("torch.nn"))
        hint(
            f"MyLayerNorm subclasses nn.{library.__name__}, so the library's forward does the work: {WRITE_THE_FORMULA}"
        )
    for function in vars(cls).values() if isinstance(cls, type) else ():
        name = refers_to(function, *(n for n in NORM_NAMES if n not in assigned_names(function)))
        if name:
            hint(f"`{getattr(function, '__name__', 'a method')}` uses `{name}`: {WRITE_THE_FORMULA}")


def _forward(module, x):
    """The learner's forward, refused when it reached a library normalisation (an alias, a stored layer, ...)."""
    with torch_calls() as called:
        out = returns(module, x)
    used = sorted({name.split(".")[0] for name in called} & NORM_CALLS)
    if used:
        hint(f"`forward` called the library's `{used[0]}`: {WRITE_THE_FORMULA}")
    return out


@EXERCISES.exercise(2, "LayerNorm as a module (write a module)", S_LAYERNORM)
def my_layer_norm(cls):
    _no_library_norm(cls)
    module = cls(6)
    expect(isinstance(module, nn.Module), "MyLayerNorm must subclass nn.Module")
    held = [name for name, m in module.named_modules() if name and isinstance(m, NORM_MODULES)]
    if held:
        hint(f"MyLayerNorm holds a library normalisation layer (`{held[0]}`): {WRITE_THE_FORMULA}")
    params = dict(module.named_parameters())
    if not params:
        buffers = dict(module.named_buffers())
        if buffers:
            hint(
                "weight and bias are buffers: buffers are not learned (no optimizer sees them); make them "
                "`nn.Parameter`s",
                S_STATE,
            )
        hint(
            "the module has no parameters: a tensor assigned as `self.weight = torch.ones(n)` is a plain "
            "attribute; wrap it in `nn.Parameter` so that `parameters()` and the optimizer see it",
            S_STATE,
        )
    expect(
        set(params) == {"weight", "bias"},
        f"the module should have two parameters named weight and bias, not {sorted(params)}",
        S_STATE,
    )
    expect(
        tuple(params["weight"].shape) == (6,) and tuple(params["bias"].shape) == (6,),
        f"for MyLayerNorm(6) weight and bias should have shape (6,), not {tuple(params['weight'].shape)} and "
        f"{tuple(params['bias'].shape)}",
    )
    expect(
        torch.equal(params["weight"].detach(), torch.ones(6)) and torch.equal(params["bias"].detach(), torch.zeros(6)),
        "start like nn.LayerNorm: weight all ones, bias all zeros",
    )
    constant = torch.full((2, 6), 3.0)
    try:
        out = _forward(module, constant)
    except RuntimeError as err:
        if "must match the size of tensor" in str(err):
            hint(
                "a (2, 6) input failed to broadcast: `x.mean(-1)` and `x.var(-1)` drop the last dimension, shape "
                "(2,); pass keepdim=True so that they keep shape (2, 1) and broadcast against x"
            )
        raise
    expect(isinstance(out, torch.Tensor), f"forward should return a tensor, not a {type(out).__name__}")
    expect(
        out.shape == constant.shape,
        f"the output should have the input's shape {tuple(constant.shape)}, not {tuple(out.shape)}",
    )
    if not torch.isfinite(out).all():
        hint(
            "a row whose values are all equal gives NaN: its variance is 0, so add eps inside the square root, "
            "sqrt(var + eps)"
        )
    for module, x, eps in _layer_norm_cases(cls):
        out = _forward(module, x)
        w, b = module.weight.detach(), module.bias.detach()
        expected = F.layer_norm(x, (x.shape[-1],), w, b, eps)
        if torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
            continue
        mean = x.mean(-1, keepdim=True)
        unbiased = (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b
        if torch.allclose(out, unbiased, atol=1e-5, rtol=1e-4):
            hint(
                "you normalise with the unbiased variance (divide by n − 1, the default of `var`); LayerNorm "
                "divides by n: `var(..., correction=0)`"
            )
        outside = (x - mean) / (x.std(-1, keepdim=True, correction=0) + eps) * w + b
        if torch.allclose(out, outside, atol=1e-5, rtol=1e-4):
            hint(
                "eps goes inside the square root, sqrt(var + eps), as nn.LayerNorm does; std + eps differs "
                "when the variance is small"
            )
        if eps != 1e-5 and torch.allclose(out, F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), atol=1e-5, rtol=1e-4):
            hint("MyLayerNorm(8, eps=0.1) still uses eps = 1e-5: store the `eps` argument and use it")
        no_affine = F.layer_norm(x, (x.shape[-1],), None, None, eps)
        if torch.allclose(out, no_affine, atol=1e-5, rtol=1e-4):
            hint("the output is normalised but ignores weight and bias: multiply by weight, then add bias")
        hint(
            f"for an input of shape {tuple(x.shape)} the output differs from nn.LayerNorm's by up to "
            f"{(out - expected).abs().max():.3g}: normalise each row over the last dimension only "
            "(dim=-1, keepdim=True), then apply weight and bias"
        )
    module, x, eps = next(_layer_norm_cases(cls))
    x.requires_grad_(True)
    out = _forward(module, x)
    expect(
        out.requires_grad,
        "the output has no gradient path to weight and bias: use them in forward as they "
        "are (no `.data`, no `.detach()`, no `torch.no_grad()`)",
    )
    out.square().sum().backward()
    expect(
        module.weight.grad is not None and module.bias.grad is not None,
        "after backward() weight and bias have no gradient: use them in forward as they are (no `.data`, "
        "no `.detach()`)",
    )
    same = x.detach().clone().requires_grad_(True)
    F.layer_norm(same, (x.shape[-1],), module.weight.detach(), module.bias.detach(), eps).square().sum().backward()
    expect(
        x.grad is not None,
        "the input gets no gradient through your layer: a layer inside a network must pass the gradient on to "
        "the layers below it; do not detach x or compute under `torch.no_grad()`",
    )
    if not torch.allclose(x.grad, same.grad, atol=1e-4, rtol=1e-3):
        hint(
            f"the output is right, but the gradient with respect to the input differs from nn.LayerNorm's by up to "
            f"{(x.grad - same.grad).abs().max():.3g}: the mean and the variance depend on x too, and backward must "
            "go through them. Computed under `torch.no_grad()` or from `x.detach()`, they count as constants, and "
            "every layer below yours would be trained with wrong gradients"
        )
    module = copy.deepcopy(module).to(torch.float64)
    out = _forward(module, x.detach().double())
    expect(
        out.dtype == torch.float64,
        f"after `.to(torch.float64)` a float64 input gives {out.dtype}: your forward converts to another dtype "
        "(`.float()`, `.to(torch.float32)`, or a tensor it creates with a fixed dtype). A layer computes in the "
        "dtype of its input and parameters, so that `.to()` (float64 for a check, bfloat16 to save memory) "
        "applies to the whole model",
        S_STATE,
    )


ADAM_CASES = (
    # lr, betas, eps, weight_decay (None: the function's defaults, as AdamW's), steps
    (0.01, (0.9, 0.999), 1e-8, 0.1, 6),
    (0.1, (0.5, 0.8), 1e-3, 0.5, 5),
    (0.05, None, None, None, 4),
)
ADAM_LIBRARY = (
    torch.optim.Optimizer.__init__,
    _adam.adam,
    _adam._single_tensor_adam,
    _adam._multi_tensor_adam,
    _adam._fused_adam,
    torch._fused_adam_,
    torch._fused_adamw_,
)
ADAM_NAMES = (
    "optim",
    "AdamW",
    "Adam",
    "adam.adam",
    "adamw.adamw",
    "_single_tensor_adam",
    "_multi_tensor_adam",
    "_fused_adam",
    "_fused_adam_",
    "_fused_adamw_",
)
WRITE_THE_UPDATE = (
    "write the update from the formulas of sections 2.3 and 2.4 (two moments, their bias correction, the decoupled "
    "decay); knowing what the optimizer computes is what lets you read `optimizer.state`, choose betas and eps, "
    "and see why Adam's L2 decay differs from AdamW's; use torch.optim.AdamW only to compare afterwards"
)


def _adam_gradients(seed, steps):
    """Gradients for a (3, 4) matrix and a (5,) vector, fixed in advance so that every variant sees the same ones:
    sizes from 1e-6 to 1e2 (eps matters), and one row that never gets a gradient (only decay moves it)."""
    g = torch.Generator().manual_seed(seed)
    scales = (10.0 ** torch.arange(-6, 3, dtype=torch.float64)).repeat(2)[:12].reshape(3, 4)
    out = []
    for _ in range(steps):
        a = torch.randn(3, 4, generator=g, dtype=torch.float64) * scales
        a[2] = 0.0
        out.append((a, torch.randn(5, generator=g, dtype=torch.float64)))
    return out


def _adam_variant(starts, grads, lr, betas, eps, wd, mistake=None):
    """AdamW as section 2.3-2.4 writes it, or with one of the usual mistakes; the parameters after each step."""
    beta1, beta2 = betas
    ws = [w.clone() for w in starts]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    path = []
    for t, step_grads in enumerate(grads, start=1):
        tc = t - 1 if mistake == "t from 0" else t
        for i, g in enumerate(step_grads):
            w = ws[i]
            if mistake == "L2":
                g = g + wd * w
            elif mistake == "decay without lr":
                w = w * (1 - wd)
            elif mistake not in ("decay after", "no decay"):
                w = w * (1 - lr * wd)
            if mistake == "betas swapped":
                ms[i] = beta1 * g + (1 - beta1) * ms[i]
                vs[i] = beta2 * g * g + (1 - beta2) * vs[i]
            else:
                ms[i] = beta1 * ms[i] + (1 - beta1) * g
                vs[i] = beta2 * vs[i] + (1 - beta2) * g * g
            if mistake == "no bias correction":
                m_hat, v_hat = ms[i], vs[i]
            else:
                m_hat, v_hat = ms[i] / (1 - beta1**tc), vs[i] / (1 - beta2**tc)
            if mistake == "eps inside":
                w = w - lr * m_hat / (v_hat + eps).sqrt()
            else:
                w = w - lr * m_hat / (v_hat.sqrt() + eps)
            if mistake == "decay after":
                w = w * (1 - lr * wd)
            ws[i] = w
        path.append([w.clone() for w in ws])
    return path


ADAM_MISTAKES = {
    "L2": "the decay went through the gradient (g + λ·w, the L2 of `Adam(weight_decay=…)`), so Adam's scaling "
    "divides it by sqrt(v̂): weights with large gradients hardly decay, and the row that never gets a gradient "
    "moves by about lr per step whatever λ is. AdamW decouples it: shrink the weights by (1 − lr·λ), and leave "
    "the gradient alone",
    "decay without lr": "the weights shrink by (1 − λ) per step: the decoupled decay is scaled by the learning rate, "
    "w ← w·(1 − lr·λ), so that it follows the schedule as the gradient step does",
    "decay after": "the decay comes after the Adam step: torch.optim.AdamW shrinks the weights first, "
    "w ← w·(1 − lr·λ), then subtracts lr·m̂/(sqrt(v̂) + eps)",
    "no decay": "the weights are not decayed: AdamW shrinks them by (1 − lr·λ) at every step",
    "no bias correction": "the moments are used without bias correction: they start at zero, so early on they are "
    "too small; divide m by (1 − β1^t) and v by (1 − β2^t), with t the number of steps taken so far, this one "
    "included",
    "t from 0": "the bias correction divides by 1 − β^t, which is 0 if t is 0: t counts the steps taken so far, "
    "this one included, so it is 1 at the first step",
    "eps inside": "eps is added inside the square root: Adam adds it to sqrt(v̂), after the root and the bias "
    "correction, which matters for gradients near eps",
    "betas swapped": "β weighs the old average, not the new gradient: m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g²",
}


def _tensors_in(value, depth=0):
    """The floating-point tensors kept in the learner's `state` (in dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.numel() > 1 else []
    if depth > 4:
        return []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for item in items for t in _tensors_in(item, depth + 1)]


def _same(a, b):
    return a.shape == b.shape and torch.allclose(a.double(), b, rtol=1e-9, atol=1e-12)


def _kept_in_state(state, theirs):
    """Hint unless the learner's `state` holds AdamW's two moments of every parameter (the step count may be shared)."""
    kept = _tensors_in(state)
    for moments in theirs:
        for key in ("exp_avg", "exp_avg_sq"):
            want = moments[key]
            if not any(t.shape == want.shape and torch.allclose(t.double(), want, rtol=1e-6, atol=0) for t in kept):
                hint(
                    "the parameters move as AdamW's, but `state` does not hold the two moments of each parameter "
                    "(exp_avg and exp_avg_sq, section 2.5): they are kept elsewhere (attributes of the tensors, a "
                    "global, a default argument). The caller owns `state`, as it owns `optimizer.state`: it saves it "
                    "in a checkpoint (`optimizer.state_dict()`) to resume training, and a second optimizer passes a "
                    "dict of its own; so what the update needs from step to step belongs in it",
                    S_STATE_DICT,
                )


def _adam_call(fn, params, state, lr, betas, eps, wd):
    if betas is None:
        return fn(params, state, lr)
    return fn(params, state, lr, betas=betas, eps=eps, weight_decay=wd)


@EXERCISES.exercise(3, "AdamW, one step at a time (write a function)", S_ADAM)
def adamw_by_hand(fn):
    name = refers_to(fn, *(n for n in ADAM_NAMES if n not in assigned_names(fn)))
    if name:
        hint(f"your function uses `{name}`: {WRITE_THE_UPDATE}", S_ADAMW)
    for case, (lr, betas, eps, wd, steps) in enumerate(ADAM_CASES):
        g = torch.Generator().manual_seed(30 + case)
        starts = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
        grads = _adam_gradients(case, steps)
        params = [w.clone().requires_grad_(True) for w in starts]
        reference = [w.clone().requires_grad_(True) for w in starts]
        options = {} if betas is None else {"betas": betas, "eps": eps, "weight_decay": wd}
        optimizer = torch.optim.AdamW(reference, lr=lr, **options)
        real = (betas or (0.9, 0.999), eps or 1e-8, 0.01 if wd is None else wd)
        state = {}
        mine, theirs = [], []
        storages = [p.data_ptr() for p in params]
        for step_grads in grads:
            for p, q, grad in zip(params, reference, step_grads):
                p.grad, q.grad = grad.clone(), grad.clone()
            optimizer.step()
            theirs.append([q.detach().clone() for q in reference])
            with calls_to(*ADAM_LIBRARY) as library:
                _adam_call(fn, params, state, lr, betas, eps, wd)
            if library:
                hint(f"your function ran the library's `{next(iter(library))}`: {WRITE_THE_UPDATE}", S_ADAMW)
            mine.append([p.detach().clone() for p in params])
        expect(
            isinstance(state, dict) and len(state) > 0,
            "`state` is still empty after the steps: keep the moments and the step count in it, one set per "
            "parameter (as `optimizer.state` does), not in global variables, which a second optimizer would share",
            S_STATE_DICT,
        )
        if all(_same(a, b) for a, b in zip(mine[-1], theirs[-1])):
            _kept_in_state(state, [optimizer.state[q] for q in reference])
            if [p.data_ptr() for p in params] != storages:
                hint(
                    "the numbers are AdamW's, but your function gave the parameters new memory (`p.data = ...` or "
                    "`p.set_(...)`) instead of updating them in place: a view of a parameter (a slice, `p.t()`, the "
                    "flat buffer some wrappers keep parameters in) then keeps the old values, and every step "
                    "allocates the parameters anew. Update each tensor in place under `torch.no_grad()`",
                    S_ADAM,
                )
            continue
        if any(t.dtype != torch.float64 for t in _tensors_in(state)):
            hint(
                "some tensors in `state` are not float64 like the parameters (the check uses float64), so your "
                "moments are rounded: create them with `torch.zeros_like(p)`, which copies p's dtype and device"
            )
        if all(torch.equal(a, w) for a, w in zip(mine[0], starts)):
            hint(
                "the parameters did not change: update each tensor in place under `torch.no_grad()` (`p.mul_`, "
                "`p.add_`, `p.addcdiv_` or `p.copy_(...)`); `p = p - ...` rebinds only the loop's variable"
            )
        if not all(torch.isfinite(a).all() for a in mine[-1]):
            hint("your parameters hold inf or NaN, as after a division by zero: " + ADAM_MISTAKES["t from 0"], S_ADAM)
        for mistake, message in ADAM_MISTAKES.items():
            path = _adam_variant(starts, grads, lr, *real, mistake=mistake)
            if all(_same(a, b) for a, b in zip(mine[-1], path[-1])):
                hint(message, S_ADAMW if mistake in ("L2", "decay without lr", "decay after", "no decay") else S_ADAM)
        if betas is None:
            hint(
                f"called as `adamw_step(params, state, lr={lr})`, your function differs from AdamW's defaults: "
                "betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, as in the stub's signature"
            )
        first = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if not all(map(_same, a, b)))
        hint(
            f"with lr={lr}, betas={real[0]}, eps={real[1]}, weight_decay={real[2]} the parameters first differ from "
            f"torch.optim.AdamW's after step {first + 1}: compare each line with the formulas (decay, both moments, "
            "bias correction with t counted from 1, eps after the square root), and keep a separate m, v per parameter",
        )


def _expected_factor(step, warmup, total):
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def _fit_setup(seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(48, 3, generator=g)
    y = (x[:, :1] - 2 * x[:, 1:2]).tanh() + x[:, 2:] ** 2
    return model, DataLoader(TensorDataset(x, y), batch_size=8)


def _reference_fit(model, loader, epochs, lr, weight_decay, warmup, zero_grad=True):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    total = epochs * len(loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _expected_factor(s, warmup, total))
    for _ in range(epochs):
        for xb, yb in loader:
            if zero_grad:
                optimizer.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            optimizer.step()
            scheduler.step()


def _check_groups(optimizer, model, lr, weight_decay):
    decoupled = isinstance(optimizer, torch.optim.Adam) and all(
        g.get("decoupled_weight_decay", False) for g in optimizer.param_groups
    )
    if isinstance(optimizer, torch.optim.Adam) and not decoupled:
        hint(
            "that is Adam, whose weight_decay adds λ·w to the gradient (L2), where Adam's per-element scaling "
            "divides it away: weights with large gradients hardly decay, and a weight the loss ignores moves by "
            "about lr per step whatever λ is. The recipe wants the decay decoupled from the gradient, every weight "
            "shrunk by (1 − lr·λ): that is AdamW",
            S_ADAMW,
        )
    expect(
        isinstance(optimizer, torch.optim.AdamW) or decoupled,
        f"the first value returned should be the optimizer that trained the model, AdamW, not "
        f"{type(optimizer).__name__}: the recipe needs Adam's per-element step sizes and a weight decay decoupled "
        "from them",
        S_ADAMW,
    )
    decay_of = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            decay_of[id(p)] = group["weight_decay"]
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [n for i, n in names.items() if i not in decay_of]
    expect(not missing, f"some parameters are in no group and would never be trained: {missing}", S_DECAY)
    one_d = [p for p in model.parameters() if p.ndim < 2]
    wrong_decayed = [names[id(p)] for p in one_d if decay_of[id(p)] != 0]
    if wrong_decayed:
        if all(not n.endswith("bias") for n in wrong_decayed):
            hint(
                f"the LayerNorm weight ({wrong_decayed[0]}) is still decayed: exempt every 1-D tensor "
                "(p.ndim < 2), not only the biases",
                S_DECAY,
            )
        hint(
            f"1-D tensors are decayed ({', '.join(wrong_decayed)}): give the biases and the LayerNorm weight "
            "weight_decay=0",
            S_DECAY,
        )
    not_decayed = [
        names[i]
        for i, p in ((id(p), p) for p in model.parameters())
        if p.ndim >= 2 and not math.isclose(decay_of[i], weight_decay)
    ]
    expect(
        not not_decayed,
        f"the weight matrices ({', '.join(not_decayed)}) should have weight_decay={weight_decay}",
        S_DECAY,
    )
    for group in optimizer.param_groups:
        expect(
            math.isclose(group.get("initial_lr", group["lr"]), lr),
            f"every group should start from the base learning rate {lr}, not {group.get('initial_lr', group['lr'])}",
            S_LAMBDA,
        )


def _check_rates(lrs, lr, warmup, total, steps_per_epoch, warned):
    expect(
        isinstance(lrs, (list, tuple)),
        f"the second value returned should be a list of learning rates, not a {type(lrs).__name__}",
    )
    expected = [lr * _expected_factor(s, warmup, total) for s in range(total)]
    if warned:
        hint(
            "the scheduler is stepped before the optimizer: PyTorch warns, and the first value of the schedule is "
            "skipped; call `optimizer.step()`, then `scheduler.step()`",
            S_LAMBDA,
        )
    if len(lrs) == total and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(lrs, expected[1:])):
        hint(
            'each rate in lrs is the one of the next step: read `optimizer.param_groups[0]["lr"]` before '
            "`optimizer.step()`; after `scheduler.step()` it already holds the next step's rate",
            S_LAMBDA,
        )
    epochs = total // steps_per_epoch
    per_epoch = [lr * _expected_factor(s // steps_per_epoch, warmup, total) for s in range(total)]
    if len(lrs) == epochs or (
        len(lrs) == total and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(lrs, per_epoch))
    ):
        hint(
            "the schedule advances once per epoch: step the scheduler after every batch (the warm-up and the "
            "cosine count optimizer steps)",
            S_WARMUP,
        )
    expect(
        len(lrs) == total,
        f"{total} optimizer steps were expected ({epochs} epochs of {steps_per_epoch} "
        f"batches), but lrs has {len(lrs)} entries: append the rate once per step",
    )
    if all(math.isclose(a, lr * b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(lrs, expected)):
        hint(
            "the rates are lr times too small: LambdaLR multiplies the base rate by what the lambda returns, "
            "so the lambda returns a factor, not a rate",
            S_LAMBDA,
        )
    if warmup > 1 and all(
        math.isclose(a, lr * (s / warmup), rel_tol=1e-6, abs_tol=1e-12) for s, a in enumerate(lrs[:warmup])
    ):
        hint(
            f"the warm-up starts at 0: with f(s) = s / w the first step runs at lr = 0 and learns nothing; the "
            f"formula's factor is (s + 1) / w, so the rate reaches lr at step w − 1 = {warmup - 1}",
            S_WARMUP,
        )
    late = [lr * (1 / warmup + (1 - 1 / warmup) * min(s, warmup) / warmup) for s in range(warmup + 1)]
    if warmup > 1 and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(lrs, late)):
        hint(
            f"the warm-up reaches lr one step late, at step w = {warmup}: the formula's factor (s + 1) / w is 1 at "
            f"step w − 1 = {warmup - 1} (a `LinearLR` with total_iters=w takes w steps to get there)",
            S_WARMUP,
        )
    for step, (got, want) in enumerate(zip(lrs, expected)):
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            hint(
                f"`lrs[{step}]` is {got:.6g}, expected {want:.6g} (warm-up {warmup} steps, {total} steps in all): "
                "check the factor f(s) against the formula",
                S_WARMUP,
            )


@EXERCISES.exercise(4, "AdamW with decay groups and warm-up + cosine, in notebook 04's loop (stretch)", S_WARMUP)
def fit(fn):
    for seed, epochs, lr, weight_decay, warmup in ((0, 2, 0.05, 0.1, 3), (1, 3, 0.02, 0.5, 1)):
        model, loader = _fit_setup(seed)
        reference, forgetful = copy.deepcopy(model), copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as caught, counting_calls(LRScheduler, "step") as scheduled:
            warnings.simplefilter("always")
            try:
                result = returns(fn, model, loader, epochs, lr, weight_decay, warmup)
            except ValueError as err:
                if "more than one parameter group" in str(err):
                    hint(
                        "a parameter is listed in two groups (the optimizer refuses): build the two lists so that "
                        "each parameter lands in exactly one",
                        "2.6 Parameter groups: a smaller learning rate for the backbone",
                    )
                raise
        warned = any("before `optimizer.step()`" in str(w.message) for w in caught)
        expect(isinstance(result, tuple) and len(result) == 2, "return a pair: (optimizer, lrs)")
        optimizer, lrs = result
        expect(
            scheduled[0] > 0,
            "no scheduler set the rates: let a scheduler (`LambdaLR`, or a chain of built-in ones) change them "
            "after every batch; it keeps the step count and the base rates, which a checkpoint saves with "
            "`scheduler.state_dict()` so that a resumed run continues the schedule",
            S_LAMBDA,
        )
        _check_groups(optimizer, model, lr, weight_decay)
        total = epochs * len(loader)
        _check_rates(lrs, lr, warmup, total, len(loader), warned)
        _reference_fit(reference, loader, epochs, lr, weight_decay, warmup)
        if all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(model.parameters(), reference.parameters())):
            continue
        if all(torch.equal(a, b) for a, b in zip(model.parameters(), forgetful.parameters())):
            hint(
                "the model's parameters did not change: train the model you were given (the optimizer must hold "
                "its parameters) and call `optimizer.step()`",
                S_LOOP,
            )
        _reference_fit(forgetful, loader, epochs, lr, weight_decay, warmup, zero_grad=False)
        if all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(model.parameters(), forgetful.parameters())):
            hint("gradients pile up from step to step: call `optimizer.zero_grad()` before each backward()", S_LOOP)
        hint(
            "the rates and groups are right but the trained parameters differ from the reference: one step is "
            "zero_grad → loss = F.mse_loss(model(x), y) → backward → optimizer.step → scheduler.step, over every "
            "batch of every epoch",
            S_LOOP,
        )
