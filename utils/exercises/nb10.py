"""Checks for the exercises of notebook 10 · modules and optimizers (``notebooks/src/10_modules_and_optimizers.py``).
Used by notebook 10, whose ``Checker("10")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import copy
import math
import numbers
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from utils.exercises import Registry, expect, hint, returns

EXERCISES = Registry("10")

S_STATE = "1.1 Where a module keeps its state"
S_LIST = "1.2 `ModuleList` and `Sequential` versus a Python list"
S_DROPOUT = "1.7 `train()` and `eval()`: Dropout"
S_LAYERNORM = "1.9 LayerNorm by hand, and biased versus unbiased variance"
S_ADAMW = "2.4 Weight decay: L2 in the loss, or decoupled (AdamW)"
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
        "1: add the numbers of every registered parameter: the two Linear(4, 4) of the "
        "ModuleList (weight 4×4 plus bias 4 each), BatchNorm's weight and bias, and `scale`",
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


@EXERCISES.exercise(2, "LayerNorm as a module (write a module)", S_LAYERNORM)
def my_layer_norm(cls):
    module = cls(6)
    expect(isinstance(module, nn.Module), "MyLayerNorm must subclass nn.Module")
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
        out = returns(module, constant)
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
        out = returns(module, x)
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
    module, x, _ = next(_layer_norm_cases(cls))
    out = module(x)
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
    module = copy.deepcopy(module).to(torch.float64)
    out = module(x.double())
    expect(
        out.dtype == torch.float64,
        f"after `.to(torch.float64)` a float64 input should give float64, not "
        f"{out.dtype}: keep every tensor of the module registered so that `.to()` converts it",
        S_STATE,
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
    expect(
        isinstance(optimizer, torch.optim.AdamW),
        f"the first value returned should be the AdamW optimizer, not {type(optimizer).__name__}",
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
    for step, (got, want) in enumerate(zip(lrs, expected)):
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            hint(
                f"`lrs[{step}]` is {got:.6g}, expected {want:.6g} (warm-up {warmup} steps, {total} steps in all): "
                "check the factor f(s) against the formula",
                S_WARMUP,
            )


@EXERCISES.exercise(3, "AdamW with decay groups and warm-up + cosine, in notebook 04's loop (stretch)", S_WARMUP)
def fit(fn):
    for seed, epochs, lr, weight_decay, warmup in ((0, 2, 0.05, 0.1, 3), (1, 3, 0.02, 0.5, 1)):
        model, loader = _fit_setup(seed)
        reference, forgetful = copy.deepcopy(model), copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as caught:
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
