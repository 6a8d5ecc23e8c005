"""Checks for the exercises of notebook 07 · automatic mixed precision (``notebooks/src/07_mixed_precision.py``).
Used by notebook 07, whose ``Checker("07")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import ast
import contextlib
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_mod

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import (
    functions_reached,
    global_values,
    names_used,
    refers_to,
    syntax,
    torch_calls,
)

EXERCISES = Registry("07")

WHY = "1. Why 16 bits, and what breaks"
AUTOCAST = "2. `torch.amp.autocast`: low precision where it is safe"
SCALER = "3. `torch.amp.GradScaler`, step by step"
RECIPES = "4. Recipes"
HOOKS = "03 · 10. Practical uses of hooks"


def _as_dtype(value, which: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        found = getattr(torch, value.strip().removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    hint(f"{which}: write a dtype, such as torch.float32 or torch.bfloat16, not {value!r}")


# Exercise 1 asks for the rules, not for one printed run: the learner's function is asked about every operation
# below, on both devices, for both 16-bit types and both input types (120 questions), and must not run anything.
OPS = (
    "matmul",
    "linear",
    "conv2d",
    "bmm",
    "relu",
    "add_float32",
    "softmax",
    "log_softmax",
    "layer_norm",
    "group_norm",
    "sum",
    "exp",
    "pow",
    "cross_entropy",
    "mse_loss",
)
LOWER_LIST = {"matmul", "linear", "conv2d", "bmm"}
FLOAT32_LIST = {"cross_entropy", "mse_loss"}  # on every device
CUDA_FLOAT32_ONLY = {"softmax", "log_softmax", "layer_norm", "group_norm", "sum", "exp", "pow"}
DTYPE_ONLY = {"promote_types", "can_cast", "finfo", "iinfo"}  # reasoning about dtypes, not running an operation


def _expected(op: str, device: str, low: torch.dtype, input_dtype: torch.dtype) -> torch.dtype:
    if op in LOWER_LIST:
        return low
    if op in FLOAT32_LIST or op == "add_float32" or (device == "cuda" and op in CUDA_FLOAT32_ONLY):
        return torch.float32
    return input_dtype


def _run_on_cpu(op: str, low: torch.dtype, input_dtype: torch.dtype) -> torch.dtype:
    """What the CPU really gives (the CPU half of the table is measured, so that it follows PyTorch)."""
    x, target = torch.randn(8, 8), torch.randint(0, 8, (8,))
    ops = {
        "matmul": lambda t: t @ t,
        "linear": lambda t: F.linear(t, t),
        "conv2d": lambda t: F.conv2d(t[None, None], t[None, None, :3, :3]),
        "bmm": lambda t: torch.bmm(t[None], t[None]),
        "relu": torch.relu,
        "add_float32": lambda t: t + x,
        "softmax": lambda t: torch.softmax(t, dim=-1),
        "log_softmax": lambda t: F.log_softmax(t, dim=-1),
        "layer_norm": lambda t: F.layer_norm(t, (8,)),
        "group_norm": lambda t: F.group_norm(t[None], 2),
        "sum": torch.sum,
        "exp": torch.exp,
        "pow": lambda t: t**2,
        "cross_entropy": lambda t: F.cross_entropy(t, target),
        "mse_loss": lambda t: F.mse_loss(t, t.detach()),
    }
    with torch.no_grad(), torch.amp.autocast("cpu", dtype=low):
        return ops[op](x.to(input_dtype)).dtype


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _uses_the_checks(fn) -> str | None:
    """The module of this course's checks that the answer imports from, if any."""
    for f in functions_reached(fn):
        if any(n.startswith("utils.exercises") for n in names_used(f)):
            return "utils.exercises"
        for value in global_values(f).values():
            module = getattr(value, "__module__", None) or getattr(value, "__name__", "")
            if isinstance(module, str) and module.startswith("utils.exercises"):
                return module
    return None


@EXERCISES.exercise(1, "What autocast makes of each operation (predict)", AUTOCAST)
def predict_dtypes(fn):
    expect(callable(fn), f"give the function `autocast_dtype` itself, not {fn!r:.40}")
    if refers_to(fn, "autocast", "amp.autocast", "autocast_dtypes", "get_autocast_dtype"):
        hint(
            "your function uses autocast to find the answer: predict it from the three lists instead. Running "
            "an operation shows one device and one case; the lists tell you what every device does, including "
            'a GPU you do not have (on a machine without CUDA, `autocast("cuda")` switches itself off and '
            "everything stays float32)"
        )
    if _uses_the_checks(fn):
        hint("your function uses the checks' own code: write the rules yourself")
    for f in functions_reached(fn):
        for value in global_values(f).values():
            if isinstance(value, dict) and len(value) >= 30 and all(isinstance(v, torch.dtype) for v in value.values()):
                hint(
                    f"your function looks its answers up in a table of {len(value)} dtypes, one per case: a "
                    "table filled by running the operations measures one device instead of predicting every one, "
                    "and a table typed out by hand skips the rules. Write the rules: a few sets of names and `if`s"
                )
    questions = [
        (op, device, low, input_dtype)
        for device in ("cpu", "cuda")
        for low in (torch.float16, torch.bfloat16)
        for input_dtype in (torch.float32, low)
        for op in OPS
    ]
    with torch_calls() as calls:
        answers = [returns(fn, *q) for q in questions]
    ran = sorted(set(calls) - DTYPE_ONLY)
    if ran:
        hint(
            f"your function ran tensor operations ({', '.join(ran[:4])}): predict the dtype from the lists instead "
            "of measuring it. A measurement shows one device and one case; the lists tell you what every device "
            "does, including a GPU you do not have"
        )
    # A hint names the rule an answer broke and how many answers broke it, never one case with its dtype: with two
    # or three possible dtypes per case, a hint per case would let a learner pass by trying answers in turn.
    said_all = [_as_dtype(answer, "your answer") for answer in answers]
    same = (
        "`low`"
        if all(a == q[2] for a, q in zip(said_all, questions))
        else "`input_dtype`"
        if all(a == q[3] for a, q in zip(said_all, questions))
        else _name(said_all[0])
        if len(set(said_all)) == 1
        else None
    )
    if same:
        hint(
            f"your function returns {same} for every question: autocast treats the operations "
            "of each list differently, and those on no list differently again; sort the operations into section "
            "2's lists first"
        )
    wrong: dict[str, int] = {}
    for (op, device, low, input_dtype), answer in zip(questions, answers):
        said = _as_dtype(answer, f"{op} on {device}")
        right = _run_on_cpu(op, low, input_dtype) if device == "cpu" else _expected(op, device, low, input_dtype)
        if said == right:
            continue
        if said in (torch.float16, torch.bfloat16) and said != low:
            rule = "other16"
        elif op in LOWER_LIST:
            rule = "lower"
        elif op in FLOAT32_LIST:
            rule = "losses"
        elif op == "add_float32":
            rule = "promotion"
        elif op in CUDA_FLOAT32_ONLY:
            rule = f"cuda_only_{device}"
        else:
            rule = "no_list"
        wrong[rule] = wrong.get(rule, 0) + 1
    rules = {
        "other16": "the region's type: you returned a 16-bit type other than the region's, but the low-precision "
        "type of a region is its `dtype=`, the argument `low`",
        "lower": "matrix products and convolutions: find them on section 2's lists (the same on every device); what "
        "does their list do to their inputs, 16-bit or float32?",
        "losses": "the two losses: which list holds them, on which devices, and what does that list do to a 16-bit "
        "input?",
        "promotion": "`add_float32`, `t + w` with a float32 `w`: addition is on no list, but its two inputs have "
        "different types; what does type promotion give?",
        "cuda_only_cuda": "operations on CUDA that the CPU's lists leave alone: CUDA's float32 list is longer than "
        "the CPU's; which of the operations does it hold?",
        "cuda_only_cpu": "operations on the CPU that only CUDA's float32 list holds: the CPU's lists are shorter; what "
        "does autocast do with an operation on none of them?",
        "no_list": "operations on no autocast list: autocast casts inputs only for the operations on its lists; what "
        "does an operation on none of them run in?",
    }
    for rule, message in rules.items():
        if rule in wrong:
            count = wrong[rule]
            verb = "answer is" if count == 1 else "answers are"
            hint(f"{count} {verb} wrong (of {len(questions)}), about {message}")


# ---------------------------------------------------------------------------------------------- exercise 2

LR, MAX_NORM, INIT_SCALE = 0.1, 0.5, 8.0


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def _copy(model, opt, scaler):
    """An independent copy of (model with its .grad, optimizer, scaler) to replay one step."""
    m = _mlp()
    m.load_state_dict(model.state_dict())
    for p, q in zip(m.parameters(), model.parameters()):
        p.grad = None if q.grad is None else q.grad.clone()
    o = torch.optim.SGD(m.parameters(), lr=LR)
    o.load_state_dict(opt.state_dict())
    s = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    s.load_state_dict(scaler.state_dict())
    return m, o, s


def _loss(m, x, y):
    with torch.amp.autocast("cpu", dtype=torch.float16):
        return F.cross_entropy(m(x), y)


def _right(m, o, s, x, y):
    loss = _loss(m, x, y)
    o.zero_grad()
    s.scale(loss).backward()
    s.unscale_(o)
    nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM)
    s.step(o)
    s.update()
    return loss


def _clip_first(m, o, s, x, y):
    o.zero_grad()
    s.scale(_loss(m, x, y)).backward()
    nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM)  # clips the scaled gradients
    s.step(o)
    s.update()


def _no_clip(m, o, s, x, y):
    o.zero_grad()
    s.scale(_loss(m, x, y)).backward()
    s.step(o)
    s.update()


def _clip_each(m, o, s, x, y):
    o.zero_grad()
    s.scale(_loss(m, x, y)).backward()
    s.unscale_(o)
    for p in m.parameters():  # each tensor on its own, as the notes do
        nn.utils.clip_grad_norm_(p, MAX_NORM)
    s.step(o)
    s.update()


def _not_scaled(m, o, s, x, y):
    o.zero_grad()
    _loss(m, x, y).backward()
    s.unscale_(o)
    nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM)
    s.step(o)
    s.update()


def _optimizer_step(m, o, s, x, y):
    o.zero_grad()
    s.scale(_loss(m, x, y)).backward()
    o.step()  # the scaled gradients


def _no_zero_grad(m, o, s, x, y):
    s.scale(_loss(m, x, y)).backward()
    s.unscale_(o)
    nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM)
    s.step(o)
    s.update()


MISTAKES = [
    (
        _clip_first,
        "the gradients were clipped while still scaled: call `scaler.unscale_(optimizer)` before "
        "`clip_grad_norm_`, or the clipping threshold is in the wrong units",
        RECIPES,
    ),
    (
        _no_clip,
        "the gradients' norm was not clipped: the norm of all the gradients together must be clipped to "
        "`max_norm`, once they are unscaled and before the step (`clip_grad_value_` clips each element to "
        "±max_norm instead, and here changes nothing)",
        RECIPES,
    ),
    (
        _clip_each,
        "each parameter's gradient was clipped on its own, one `clip_grad_norm_` call per tensor: the limit is "
        "on the norm of all the gradients together, one norm for the whole model, so that every gradient is "
        "scaled by the same factor and the update keeps its direction (per tensor, each layer gets its own "
        "factor and the direction changes; section 3 clips `x` and `z` both ways)",
        SCALER,
    ),
    (
        _not_scaled,
        "the backward pass started from the unscaled loss, so `unscale_` divided true gradients by the "
        "scale: call `scaler.scale(loss).backward()`",
        SCALER,
    ),
    (
        _optimizer_step,
        "`optimizer.step()` used the scaled gradients, `scale` times too large: step with "
        "`scaler.step(optimizer)`, which unscales them first (and skips steps with inf/nan)",
        SCALER,
    ),
    (
        _no_zero_grad,
        "the gradients of the previous step were still there: call `optimizer.zero_grad()` in every "
        "step (at its start, or after `scaler.update()`, as many training loops do)",
        "02 · 4. The graph is freed; gradients accumulate (梯度累加)",
    ),
]


@contextlib.contextmanager
def _watching_scaler(scaler: torch.amp.GradScaler):
    """Whether the learner called ``scaler.unscale_`` itself (``scaler.step`` calls it too when nobody did), and
    which of backward/step ran inside an autocast region."""
    seen: dict = {"unscaled": 0, "in_step": False, "in_autocast": []}
    unscale, step = scaler.unscale_, scaler.step
    run_backward = torch.autograd._engine_run_backward

    def watched_unscale(optimizer):
        if not seen["in_step"]:
            seen["unscaled"] += 1
        return unscale(optimizer)

    def watched_step(optimizer, *args, **kwargs):
        if torch.is_autocast_enabled("cpu") and "`scaler.step`" not in seen["in_autocast"]:
            seen["in_autocast"].append("`scaler.step`")
        seen["in_step"] = True
        try:
            return step(optimizer, *args, **kwargs)
        finally:
            seen["in_step"] = False

    def watched_backward(*args, **kwargs):
        if torch.is_autocast_enabled("cpu") and "`backward`" not in seen["in_autocast"]:
            seen["in_autocast"].insert(0, "`backward`")
        return run_backward(*args, **kwargs)

    scaler.unscale_, scaler.step = watched_unscale, watched_step
    torch.autograd._engine_run_backward = watched_backward
    try:
        yield seen
    finally:
        del scaler.unscale_, scaler.step
        torch.autograd._engine_run_backward = run_backward


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(p, q, rtol=1e-5, atol=1e-7, equal_nan=True) for p, q in zip(a, b))


@EXERCISES.exercise(2, "One AMP training step in the right order (write a function)", SCALER)
def amp_step_check(fn):
    if _uses_the_checks(fn):
        hint("your function uses the checks' own code: write the step yourself")
    g = torch.Generator().manual_seed(7)
    batches = [(3 * torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(4)]
    batches[2][0][0, 0] = 1e5  # above float16's 65504: this step overflows and must be skipped
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
        seen_dtypes = []
        model[0].register_forward_hook(lambda mod, args, out: seen_dtypes.append(out.dtype))
        for number, (x, y) in enumerate(batches):
            before = _copy(model, opt, scaler)
            expected_model, expected_opt, expected_scaler = _copy(*before)
            expected_loss = _right(expected_model, expected_opt, expected_scaler, x, y)
            try:
                with _watching_scaler(scaler) as watched:
                    loss = returns(fn, model, opt, scaler, x, y, MAX_NORM)
            except AssertionError as err:  # GradScaler's own checks are asserts
                if "_scale is None" in str(err):
                    hint(
                        "the scaler had no scale yet: it gets one at its first `scaler.scale(loss)`, and the backward "
                        "pass must start from that scaled loss"
                    )
                if "No inf checks were recorded" in str(err) and all(p.grad is None for p in model.parameters()):
                    hint(
                        "no parameter had a gradient when the scaler unscaled and stepped: zero the gradients "
                        "before `backward()` (or after `scaler.update()`), never between backward and step"
                    )
                if "No inf checks were recorded" in str(err):
                    hint(
                        "`scaler.update()` found no inf/nan check to learn from: step with "
                        "`scaler.step(optimizer)`, not `optimizer.step()`"
                    )
                raise
            except RuntimeError as err:
                message = str(err)
                if "since the last update()" in message or "after step()" in message:
                    hint(
                        "the scaler refused a second step: call `scaler.update()` at the end of every step, "
                        "after `scaler.step(optimizer)`"
                    )
                raise
            if scaler._scale is None:  # internal: set by the first `scale()`
                own = refers_to(fn, "GradScaler")
                hint(
                    "the `GradScaler` you were given was never used: scale, unscale, step and update with the "
                    "`scaler` argument, "
                    + (
                        "not one made inside the function, which starts afresh every step and forgets its scale"
                        if own
                        else "which keeps its scale from step to step"
                    )
                    + ": the scale must halve after an overflow and grow again after clean steps",
                    SCALER,
                )
            if scaler._per_optimizer_states[id(opt)]["stage"].name != "READY":  # internal, as in section 3
                hint(
                    "after your step the scaler is not back in its READY state: `scaler.update()` must be its last "
                    "call in every step, after `scaler.step(optimizer)`"
                )
            if seen_dtypes and seen_dtypes[-1] == torch.float32:
                hint(
                    "the forward pass ran in float32: compute the output and the loss inside "
                    "`with torch.amp.autocast(x.device.type, dtype=torch.float16):`",
                    AUTOCAST,
                )
            if seen_dtypes and seen_dtypes[-1] == torch.bfloat16:
                hint(
                    "the forward pass ran in bfloat16: this exercise uses float16, the type that needs a "
                    "GradScaler (bfloat16 has float32's range and does not)",
                    WHY,
                )
            expect(isinstance(loss, (torch.Tensor, float)), f"return the loss, not a {type(loss).__name__}")
            loss = torch.as_tensor(loss)
            if loss.dtype == torch.float16:
                hint(
                    "the loss is float16: compute it inside the autocast region, where `cross_entropy` runs in float32",
                    AUTOCAST,
                )
            if number == 0 and torch.allclose(loss.detach().float(), INIT_SCALE * expected_loss.detach()):
                hint("return the loss itself, not `scaler.scale(loss)`: the scaled loss is only for `backward()`")
            expect(
                torch.allclose(loss.detach().float().cpu(), expected_loss.detach(), rtol=1e-3, equal_nan=True),
                f"the returned loss {loss.item():.4f} is not the cross-entropy of this batch "
                f"({expected_loss.item():.4f})",
            )
            after = _params(model)
            if number == 2:  # the overflow
                if not all(torch.isfinite(p).all() for p in after):
                    hint(
                        "an overflowing step wrote inf/nan into the weights: step with `scaler.step(optimizer)`, "
                        "which skips the update when the gradients are not finite, never `optimizer.step()`"
                    )
                expect(
                    scaler.get_scale() == expected_scaler.get_scale(),
                    "after an overflow the scale should "
                    f"halve ({expected_scaler.get_scale():g}), but it is {scaler.get_scale():g}: call "
                    "`scaler.update()` after `scaler.step(optimizer)`",
                )
            if _close(after, _params(expected_model)):
                if watched["in_autocast"]:
                    hint(
                        f"your function called {' and '.join(watched['in_autocast'])} inside the autocast region: "
                        "autocast is for the forward pass and the loss only: the backward pass runs each operation in "
                        "the type its forward used anyway, and PyTorch advises against running it, or the "
                        "optimizer's arithmetic, under autocast. Close the `with` block after the loss",
                        AUTOCAST,
                    )
                if not watched["unscaled"]:
                    hint(
                        "your function never called `scaler.unscale_(optimizer)`: it clipped the scaled gradients "
                        "(with a threshold times the scale?). The task asks for unscale_ then clip, which keeps the "
                        "gradients, their norm and any tool that reads them in true units, whatever the scale",
                        RECIPES,
                    )
                continue
            for mistake, message, section in MISTAKES:
                m, o, s = _copy(*before)
                try:
                    mistake(m, o, s, x, y)
                except (AssertionError, RuntimeError):  # this mistake would have raised, so it is not the one
                    continue
                if _close(after, _params(m)):
                    hint(message, section)
            if number < 2 and _close(after, [p.detach() for p in before[0].parameters()]):
                hint(
                    "the weights did not change: were the gradients zeroed between the backward pass and the step? "
                    "Zero them before `backward()` (or after `scaler.update()`), and step with "
                    "`scaler.step(optimizer)`"
                )
            hint(
                "after the step the weights differ from those of the recipe: scale → backward → unscale_ → clip "
                "→ step → update"
            )


# ---------------------------------------------------------------------------------------------- exercise 3


def _hooks_left(model: nn.Module) -> bool:
    local = any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    return local or bool(module_mod._global_forward_hooks) or bool(module_mod._global_forward_pre_hooks)


def _overflowing_chain() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        for layer in (model[0], model[2], model[4]):
            layer.bias.zero_()
        model[0].weight.fill_(1.0)  # 4 inputs of 2.0: outputs 8
        model[2].weight.fill_(2000.0)  # 8 * 8 * 2000 = 128000 > 65504: inf in float16, fine in float32
        model[4].weight.normal_()
    return model


def _nested() -> nn.Module:
    model = nn.Sequential(
        OrderedDict(
            stem=nn.Linear(4, 8),
            block=nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
            head=nn.Linear(8, 2),
        )
    )
    with torch.no_grad():
        model.stem.weight.fill_(1.0)
        model.stem.bias.zero_()
        model.block[0].weight.fill_(2000.0)  # 128000: inf in float16, passed on by the ReLU and the container
        model.block[0].bias.zero_()
    return model


def _hidden() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        model[0].weight.fill_(-10000.0)  # -80000: -inf in float16; the ReLU makes it 0, the model's output is finite
        model[0].bias.zero_()
    return model


class _Watch:
    """What happened when the learner's function ran a model: runs of the model and of each module, the modes the
    model ran in, whether forward hooks were in place, whether a copy ran."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.modules = {id(m) for m in model.modules()}
        self.runs: dict[int, int] = {}
        self.copy_ran = False
        self.autocast: list[tuple[bool, torch.dtype]] = []
        self.grad: list[bool] = []
        self.hooked: list[bool] = []

    def pre_hook(self, module, args):
        if id(module) not in self.modules:
            self.copy_ran = True  # a deepcopy carries this hook along
            return
        self.runs[id(module)] = self.runs.get(id(module), 0) + 1
        if module is self.model:
            self.autocast.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            self.grad.append(torch.is_grad_enabled())
            self.hooked.append(
                bool(module_mod._global_forward_hooks) or any(len(m._forward_hooks) for m in self.model.modules())
            )


def _finally_in(fn) -> bool:
    """Whether the answer (or a helper it calls) has a `finally` block or a `with` statement (an ExitStack, say)."""
    for f in functions_reached(fn):
        tree = syntax(f)
        for node in ast.walk(tree) if tree is not None else ():
            if (isinstance(node, ast.Try) and node.finalbody) or isinstance(node, ast.With):
                if isinstance(node, ast.Try) or any("ExitStack" in ast.unparse(item) for item in node.items):
                    return True
    return False


def _ask(fn, model, x):
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    watch = _Watch(model)

    def pre_hook(module, args):  # a function, not a bound method: a deepcopy of the model shares it
        watch.pre_hook(module, args)

    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules()]
    try:
        name = fn(model, x)  # None is a valid answer here, so no `returns`
    finally:
        for handle in handles:
            handle.remove()
    runs = watch.runs.get(id(model), 0)
    if watch.copy_ran and runs == 0:
        hint(
            "your function ran a copy of the model: hook and run the model you were given (a copy of a large "
            "model doubles its memory, and the names to report are those of the model itself)",
            HOOKS,
        )
    if runs == 0:
        hint(
            "the model itself never ran: call `model(x)` once, and let forward hooks report each module's output. "
            "Calling the modules one after another yourself works only for a `Sequential`; a model with its own "
            "`forward` (a residual block, say) runs its modules in an order only its `forward` knows",
            HOOKS,
        )
    if runs > 1:
        hint(
            f"the model ran {runs} times: run it once, with a hook on every module, and note the first "
            "non-finite output as the hooks fire (a large model may take minutes per forward pass)",
            HOOKS,
        )
    if any(count > 1 for count in watch.runs.values()):
        hint(
            "besides `model(x)`, your function ran some of its modules itself, one after another: only the "
            "model's own `forward` knows in which order its modules run (a residual block adds its input back), "
            "so watch that one run with forward hooks instead",
            HOOKS,
        )
    if not watch.hooked[0]:
        hint(
            "no forward hook was registered when the model ran: register one on every module of "
            "`model.named_modules()` before `model(x)`, and let each report its module's output",
            HOOKS,
        )
    if _hooks_left(model):
        hint(
            "hooks are still registered after your function returned: keep every handle and call "
            "`handle.remove()` in a `finally` block",
            HOOKS,
        )
    if any(p.dtype != dtypes[n] for n, p in model.named_parameters()):
        hint(
            "your function changed the model's parameters to another dtype (`.half()`?): use autocast, which "
            "leaves the parameters float32 and casts only inside the region",
            AUTOCAST,
        )
    enabled, low = watch.autocast[0]
    if name is not None and (not enabled or low != torch.float16):  # found without seeing float16 overflow
        region = f"a {_name(low)} autocast region" if enabled else "float32, outside autocast"
        hint(
            f"the model ran in {region}: the exercise watches what float16 autocast does to these layers, so run "
            "`model(x)` inside `torch.amp.autocast(x.device.type, dtype=torch.float16)` (comparing float32 "
            "outputs with 65504 guesses at the overflow instead of seeing it)",
            AUTOCAST,
        )
    if watch.grad[0]:
        hint(
            "the model ran with gradients on: a forward pass only to inspect outputs needs no graph, and the graph "
            "keeps every activation in memory; run it under `torch.no_grad()`",
            "03 · 6. `requires_grad` propagation, `detach`, `no_grad` and `inference_mode`",
        )
    if not _finally_in(fn):
        hint(
            "your function removes its hooks only if nothing goes wrong: when the forward pass raises, the hooks "
            "stay on the model and fire in every later run. Remove them in a `finally` block",
            HOOKS,
        )
    if isinstance(name, nn.Module):
        hint('return the module\'s name as `named_modules()` gives it (a string such as "2"), not the module')
    expect(name is None or isinstance(name, str), f"return a module name (str) or None, not {type(name).__name__}")
    return name


class _Swapped(nn.Module):
    """Registers `late` before `early` but runs `early` first: named_modules() order is not the hooks' order."""

    def __init__(self):
        super().__init__()
        self.late = nn.Linear(8, 2)
        self.early = nn.Linear(4, 8)
        with torch.no_grad():
            self.early.weight.fill_(10000.0)  # 4 * 2.0 * 10000 = 80000: inf in float16
            self.early.bias.zero_()

    def forward(self, x):
        return self.late(self.early(x))


@EXERCISES.exercise(3, "Find the layer that overflows (stretch)", WHY)
def first_overflow_check(fn):
    if _uses_the_checks(fn):
        hint("your function uses the checks' own code: write it yourself")
    x = torch.full((3, 4), 2.0)
    chain = _overflowing_chain()
    found = _ask(fn, chain, x)
    if found is None:
        hint(
            'no overflow found, but layer "2" overflows in float16: run the model inside '
            "`torch.amp.autocast(x.device.type, dtype=torch.float16)` (in float32 and bfloat16 the values, about "
            "1e5, fit easily)",
            AUTOCAST,
        )
    if found == "4":
        hint(
            'you returned "4", the first module whose output holds NaN, but "2" overflowed before it: an '
            "overflow gives ±inf, and NaN comes only later (inf − inf in the next matrix product). Test with "
            "`torch.isfinite`, which catches both, not `torch.isnan`"
        )
    if found in ("", "3"):
        hint(
            f"you returned {found!r}, a module that only passes on the overflow of an earlier one: return the "
            "first module, in the order the hooks fire, whose output is not finite"
        )
    expect(found == "2", f'the first module with a non-finite output is "2" (its output reaches 128000), not {found!r}')

    tame = _overflowing_chain()
    with torch.no_grad():
        tame[2].weight.fill_(0.01)
    found = _ask(fn, tame, x)
    expect(found is None, f"when no output overflows, return None, not {found!r}")

    nested = _nested()
    found = _ask(fn, nested, x)
    if found == "block":
        hint(
            'you returned the container "block": register the hook on every module of `named_modules()`, '
            "not only on the direct children; a container's hook fires after those of the modules inside it",
            HOOKS,
        )
    expect(found == "block.0", f'the first non-finite output is that of "block.0", not {found!r}')

    found = _ask(fn, _hidden(), x)
    if found is None:
        hint(
            'no overflow found in a model whose layer "0" gives -80000 (-inf in float16) while its output is '
            "finite, because the ReLU after it turns -inf into 0: test every module's output with "
            "`torch.isfinite`, not only the model's"
        )
    expect(found == "0", f'the first non-finite output is that of "0", not {found!r}')

    found = _ask(fn, _Swapped(), x)
    if found == "late":
        hint(
            'you returned "late", the first non-finite module in the order of `named_modules()`, but this model\'s '
            '`forward` runs "early" first: return the first, in the order the hooks fire, whose output is not finite',
            HOOKS,
        )
    expect(found == "early", f'the first non-finite output is that of "early", not {found!r}')
