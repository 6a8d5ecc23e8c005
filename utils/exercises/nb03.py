"""Checks for the exercises of notebook 03 · dynamic graphs and hooks
(``notebooks/src/03_dynamic_graphs_and_hooks.py``).
Used by notebook 03, whose ``Checker("03")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import collections
import contextlib

import torch
import torch.nn.functional as F
import torch.nn.modules.module as module_hooks
from torch import nn

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import autograd_runs, refers_to, tensor_hooks, torch_calls

EXERCISES = Registry("03")

LEAVES = "4. Leaf and non-leaf tensors (叶子节点与非叶子节点), `retain_grad`"
TENSOR_HOOKS = "5. Tensor hooks: `register_hook` (钩子)"
DETACH = "6. `requires_grad` propagation, `detach`, `no_grad` and `inference_mode`"
MODULE_HOOKS = "9. Module hooks and how `nn.Module.__call__` runs them"
BACKWARD_HOOKS = "9.3 Backward hooks"
PRACTICAL_HOOKS = "10. Practical uses of hooks"
LINEAR_FUNCTION = "02 · 6. Custom Functions (自定义算子)"
BROADCASTING = "01 · 7. Broadcasting (广播) and matrix products (矩阵乘法)"

NAMES = ("w", "c", "d", "y", "z", "u", "n")


def _names(value, what):
    if isinstance(value, dict) and not value:
        hint(f"{what}: `{{}}` is an empty dict; an empty set is written `set()`")
    expect(
        isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value),
        f"{what}: write a set of names, e.g. {{'w', 'c'}}",
    )
    names = set(value)
    unknown = sorted(names - set(NAMES))
    expect(not unknown, f"{what}: {unknown} are not tensors of the exercise; the names are {', '.join(NAMES)}")
    return names


@EXERCISES.exercise(1, "Which tensors are leaves, which keep a .grad? (predict)", LEAVES)
def leaves_and_grads(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 2,
        "give a pair of sets: (names of the leaves, names of the tensors whose .grad is not None)",
    )
    leaves, with_grad = _names(answer[0], "leaves"), _names(answer[1], "with .grad")
    if "d" in leaves:
        hint(
            "leaves: d is the result of `.double()`, an operation recorded on a tensor that requires grad, so d "
            "has a grad_fn and is not a leaf. The leaf is the float32 tensor that `torch.ones(...)` made and "
            "nobody kept"
        )
    if {"y", "z"} & leaves:
        hint("leaves: y and z were computed from w, which requires grad, so each has a grad_fn: not leaves")
    if "c" not in leaves:
        hint(
            "leaves: c was created by you and requires no grad: every tensor with requires_grad=False is a "
            "leaf, by convention"
        )
    if not {"u", "n"} <= leaves:
        hint(
            "leaves: u (from `detach()`) and n (computed under `no_grad`) have no grad_fn and do not require "
            "grad: both are leaves, like c",
            DETACH,
        )
    expect(
        leaves == {"w", "c", "u", "n"},
        "leaves: w, which you created with requires_grad=True, is the leaf autograd is made for",
    )
    if "z" in with_grad:
        hint(
            "with .grad: z is not a leaf and nobody called z.retain_grad(), so z.grad stays None (reading it "
            "warns). This is the question section 4 answers: why is loss.grad None?"
        )
    if "d" in with_grad:
        hint(
            "with .grad: d came out of `.double()`, so it is not a leaf and d.grad stays None. "
            "The gradient went to the hidden "
            "float32 leaf behind `.double()`"
        )
    if {"c", "u", "n"} & with_grad:
        hint("with .grad: c, u and n do not require grad: backward never computes their gradients", DETACH)
    if "y" not in with_grad:
        hint("with .grad: y is not a leaf, but y.retain_grad() was called before backward, so y.grad is kept")
    expect(with_grad == {"w", "y"}, "with .grad: w is a leaf that requires grad, so backward fills w.grad")


def _graph_gradient(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """d sum(y) / d x as y's graph alone computes it: each node is called directly, which runs no hook (tensor
    hooks and node pre-hooks run only inside the autograd engine). None if the graph cannot be walked that way."""
    total = torch.zeros_like(x)
    stack = [(y.grad_fn, torch.ones_like(y))]
    try:
        with torch.no_grad():
            while stack:
                node, grad = stack.pop()
                if node is None or grad is None:
                    continue
                if type(node).__name__ == "AccumulateGrad":
                    total = total + grad if node.variable is x else total
                    continue
                outs = node(grad) if callable(node) else node.apply(grad)  # a custom Function's node: .apply
                outs = outs if isinstance(outs, tuple) else (outs,)
                stack.extend(zip((nxt for nxt, _ in node.next_functions), outs))
    except Exception:  # a node that wants several gradients, a Function whose backward raises...
        return None
    return total


def _hook_does_not_scale():
    hint(
        "the gradient is scaled, but not by your hook: the scaling is built into the forward computation (a "
        "`detach` trick, or a custom Function like GradCoeff), and the hook only rides along (it returns the "
        "gradient as it was, or None). This exercise practises tensor hooks: the hook itself must return the "
        "scaled gradient, because a hook changes a gradient without touching the forward pass, which is how "
        "you clip, log or rescale gradients of a model you did not write"
    )


@EXERCISES.exercise(2, "Scale a gradient with a tensor hook (write a function)", TENSOR_HOOKS)
def scale_grad(fn):
    x = torch.tensor([1.0, 2.0, -3.0], requires_grad=True)
    with tensor_hooks() as hooks:
        y = returns(fn, x, -0.5)
    node_hook = refers_to(fn, "register_prehook", "register_hook")  # a hook on y.grad_fn: not counted at run time
    expect(isinstance(y, torch.Tensor), f"return a tensor, not a {type(y).__name__}")
    expect(tuple(y.shape) == (3,), f"the result should have t's shape (3,), not {tuple(y.shape)}")
    expect(
        torch.equal(y.detach(), x.detach()),
        "the forward value changed: the result must equal t; only the "
        "gradient flowing back through it is scaled, in the backward pass",
    )
    expect(
        y.requires_grad,
        "the result does not require grad: it was cut from the graph (detach, no_grad?), so "
        "no gradient can flow back to t",
        DETACH,
    )
    in_graph = _graph_gradient(y, x)  # before the backward pass frees the graph's saved tensors
    loss = (y**2).sum() + (3 * x).sum()  # x is used twice: through the scaled tensor, and directly
    try:
        (gx,) = torch.autograd.grad(loss, x)
    except TypeError as err:
        if "hook returned" in str(err):
            hint(
                "your hook returned something that is not a tensor: a hook returns the new gradient, a tensor "
                "shaped like its argument (`grad * alpha`), or None to keep the gradient as it was"
            )
        raise
    through_y, direct = 2 * x.detach(), torch.full((3,), 3.0)
    if torch.allclose(gx, direct):
        hint(
            "no gradient reached t through your result: the graph was cut (a new leaf made with "
            "`detach().requires_grad_()`?). Return a tensor computed from t, e.g. `t.clone()`",
            DETACH,
        )
    if torch.allclose(gx, -0.5 * (through_y + direct)):
        hint(
            "the hook is on t itself, so it scales the gradient of *every* use of t, also the ones that do not "
            "go through your result. Hang it on a new tensor made from t (`t.clone()` or `t.view_as(t)`)"
        )
    if torch.allclose(gx, through_y + direct) and y is x:
        hint(
            "the gradient was not scaled: you returned t itself, so the caller's gradient never passes through the "
            "tensor that carries your hook. Return the new tensor you hung the hook on"
        )
    if torch.allclose(gx, through_y + direct):
        hint(
            "the gradient was not scaled: a hook changes the gradient only through its return value (returning "
            "None keeps it as it was). Return `grad * alpha`"
        )
    expect(
        torch.allclose(gx, -0.5 * through_y + direct),
        "the gradient through your result should be "
        "alpha times the incoming gradient, and the direct use of t should not be scaled",
    )
    if not hooks["registered"] and not node_hook:
        hint(
            "the gradient is scaled, but no hook was registered: the scaling is built into the forward "
            "computation (a `detach` trick, or a custom Function like GradCoeff). This exercise practises tensor "
            "hooks: a hook changes or inspects the gradient that reaches a tensor without touching the forward "
            "pass, which is how you clip, log or rescale gradients of a model you did not write"
        )
    expect(
        hooks["ran"] or not hooks["registered"],
        "your hook was registered but never ran during backward, so the scaling came from somewhere else: "
        "the hook must be on the tensor the gradient flows through",
    )
    if in_graph is not None and torch.allclose(in_graph, torch.full((3,), -0.5)):
        _hook_does_not_scale()  # y's graph, run without its hooks, already scales: the hooks do nothing
    if in_graph is None and not hooks["changed"] and not node_hook:
        _hook_does_not_scale()  # a graph the check cannot walk: no tensor hook returned a changed gradient
    leaf = torch.tensor([0.5, 1.5], requires_grad=True)  # a non-leaf input and another alpha
    try:  # sum's backward hands on an expanded gradient: one memory location for every element
        (g_leaf,) = torch.autograd.grad(returns(fn, leaf * 2, 3.0).sum(), leaf)
    except RuntimeError as err:
        if "refers to a single memory location" in str(err):
            hint(
                "your hook changes the gradient in place (`grad.mul_(...)`): a hook must not modify its argument. "
                "Here the gradient coming from `.sum()` is one number expanded with stride 0 (notebook 01), so "
                "an in-place write is refused. Return a new tensor, `grad * alpha`"
            )
        raise
    expect(
        torch.allclose(g_leaf, torch.full((2,), 6.0)),
        "with t = leaf * 2 (a non-leaf) and alpha = 3, "
        "d sum(result) / d leaf should be 3 * 2 = 6: use the alpha you are given, for any tensor t",
    )
    data = torch.tensor([1.0, 2.0])
    try:
        out = returns(fn, data, 2.0)
    except RuntimeError as err:
        if "doesn't require gradient" in str(err):
            hint(
                "for a tensor that does not require grad there is no gradient to scale and no hook can be "
                "registered on it: return the tensor unchanged in that case (test `t.requires_grad`)"
            )
        raise
    expect(
        isinstance(out, torch.Tensor) and torch.equal(out, data) and not out.requires_grad,
        "for a tensor that does not require grad, return a tensor equal to it that does not require grad",
    )


def _model(seed):
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model, gen


def _reference(model, layer, x, per_sample_loss):
    """Each sample's contribution to layer.weight.grad, one sample at a time (loss_fn sums per-sample losses)."""
    return torch.stack(
        [torch.autograd.grad(per_sample_loss(model(x[i : i + 1]), i), layer.weight)[0] for i in range(len(x))]
    )


_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


def _global_hooks() -> dict[str, set]:
    return {name: set(getattr(module_hooks, name)) for name in _GLOBAL_HOOKS}


def _remove_global_hooks(keep: dict[str, set]) -> None:
    for name in _GLOBAL_HOOKS:
        hooks = getattr(module_hooks, name)
        for key in set(hooks) - keep[name]:
            del hooks[key]
            module_hooks._global_forward_hooks_with_kwargs.pop(key, None)
            module_hooks._global_forward_hooks_always_called.pop(key, None)


@contextlib.contextmanager
def _watch(layer: nn.Module):
    """Note, each time ``layer`` runs inside the block, whether forward and backward hooks were registered on it (or
    on every module): ``nn.Module.__call__`` runs them around ``forward``, which is wrapped here."""
    seen = {"calls": 0, "forward": False, "backward": False, "deprecated": False}
    forward = layer.forward

    def watched(*args, **kwargs):
        seen["calls"] += 1
        g = _global_hooks()
        seen["forward"] |= bool(layer._forward_hooks or layer._forward_pre_hooks)
        seen["forward"] |= bool(g["_global_forward_hooks"] or g["_global_forward_pre_hooks"])
        seen["backward"] |= bool(layer._backward_hooks or layer._backward_pre_hooks)
        seen["backward"] |= bool(g["_global_backward_hooks"] or g["_global_backward_pre_hooks"])
        seen["deprecated"] |= bool(layer._backward_hooks) and layer._is_full_backward_hook is False
        return forward(*args, **kwargs)

    layer.forward = watched
    try:
        yield seen
    finally:
        del layer.forward


class _Handing(collections.OrderedDict):
    """A hook dict whose hooks get changed data when ``layer`` runs: its input times 2 (forward and forward pre
    hooks), its output gradient times 3 (backward and backward pre hooks). The hooks themselves still run. An
    OrderedDict, as nn.Module's own: ``prepend=True`` moves a hook to the front, handles keep a weak reference."""

    def __init__(self, items, layer, kind):
        self.layer, self.kind = layer, kind
        super().__init__(items)

    def __setitem__(self, key, hook):
        super().__setitem__(key, _handed(hook, self.layer, self.kind))


def _times(values, factor):
    with torch.no_grad():
        return tuple(v * factor if isinstance(v, torch.Tensor) else v for v in values)


def _handed(hook, layer, kind):
    def changed(module, first, *rest):
        if module is not layer:
            return hook(module, first, *rest)
        if kind == "forward":  # (module, args, [kwargs,] output) or (module, args) for a pre-hook
            given = _times(first, 2)
            result = hook(module, given, *rest)
            return first if result is given else result
        if kind == "backward":  # (module, grad_input, grad_output)
            return hook(module, first, *rest[:-1], _times(rest[-1], 3))
        return hook(module, _times(first, 3))  # backward pre-hook: (module, grad_output)

    return changed


@contextlib.contextmanager
def _changed_hook_data(layer: nn.Module):
    """While the block runs, hooks on ``layer`` (its own, global module hooks, and tensor hooks) receive changed
    data: the layer's input times 2, its output gradient times 3. A result built from what the hooks received is
    6 times the right one; a result computed some other way, with hooks for show, is not."""
    kinds = {
        "_forward_hooks": "forward",
        "_forward_pre_hooks": "forward",
        "_backward_hooks": "backward",
        "_backward_pre_hooks": "pre",
    }
    saved_layer = {name: getattr(layer, name) for name in kinds}
    saved_global = {name: getattr(module_hooks, name) for name in _GLOBAL_HOOKS}
    register_hook = torch.Tensor.register_hook

    def tensor_hook(self, hook):
        return register_hook(self, lambda grad: hook(grad * 3))

    try:
        for name, kind in kinds.items():
            setattr(layer, name, _Handing(saved_layer[name], layer, kind))
        for name in _GLOBAL_HOOKS:
            kind = kinds["_" + name.removeprefix("_global_")]
            setattr(module_hooks, name, _Handing(saved_global[name], layer, kind))
        torch.Tensor.register_hook = tensor_hook
        yield
    finally:
        torch.Tensor.register_hook = register_hook
        for name, hooks in saved_layer.items():
            setattr(layer, name, hooks)
        for name, hooks in saved_global.items():
            setattr(module_hooks, name, hooks)


def _no_forward_hook():
    hint(
        "the layer ran with no forward hook on it, so the per-sample gradients came from somewhere else "
        "(running the layers one by one, autograd once per sample, torch.func). This exercise practises "
        "module hooks: they read a layer's input and output gradient from inside any model, as it is, "
        "during one forward and one backward pass of the whole batch",
        MODULE_HOOKS,
    )


def _operations(fn, model, layer, x) -> int:
    """How many torch operations the learner's function runs for the batch ``x`` (more for a larger batch: a loop)."""
    with torch_calls() as calls:
        fn(model, layer, x, lambda out: out.pow(2).sum())  # a loss for any batch size
    return sum(calls.values())


DEPRECATED_HOOK = (
    "your backward hook was registered with `register_backward_hook`, which is deprecated: on a "
    "module made of several operations it hooks the last one only, so its grad_input is not the "
    "module's (PyTorch warns). Use `register_full_backward_hook`, which works for any module"
)


@EXERCISES.exercise(3, "Per-sample gradients with module hooks (stretch)", MODULE_HOOKS)
def per_sample_grads(fn):
    if refers_to(fn, "register_backward_hook"):  # before it runs: its FutureWarning is an error under the tests
        hint(DEPRECATED_HOOK, BACKWARD_HOOKS)
    cases = []
    model, gen = _model(7)
    x, targets = torch.randn(6, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    cases.append(
        (
            model,
            model[4],
            x,
            lambda out: F.cross_entropy(out, targets),
            lambda out_i, i: F.cross_entropy(out_i, targets[i : i + 1]) / len(x),
        )
    )
    model, gen = _model(8)
    x = torch.randn(7, 4, generator=gen)
    cases.append((model, model[2], x, lambda out: out.pow(2).sum(), lambda out_i, i: out_i.pow(2).sum()))
    for model, layer, x, loss_fn, per_sample_loss in cases:
        n, n_out, n_in = len(x), layer.out_features, layer.in_features
        global_before = _global_hooks()
        try:
            with _watch(layer) as seen, tensor_hooks() as hooks, autograd_runs() as runs:
                g = returns(fn, model, layer, x, loss_fn)
        except Exception:
            _remove_global_hooks(global_before)  # a global hook left behind by the failed call would fire everywhere
            if not seen["forward"] and refers_to(fn, "functional_call", "vmap", "func.grad"):
                _no_forward_hook()  # torch.func on one sample at a time: cross_entropy's targets are the batch's
            raise
        if _global_hooks() != global_before:
            _remove_global_hooks(global_before)  # undo what the answer left behind, for the learner's later cells
            hint(
                "a global module hook you registered (`register_module_forward_hook` and friends) was still "
                "registered after the function returned (the check removed it): keep its handle and call "
                "`handle.remove()`, or it fires for every module of the program from then on",
                MODULE_HOOKS,
            )
        leftover = sum(
            len(registered)
            for registered in (
                layer._forward_hooks,
                layer._forward_pre_hooks,
                layer._backward_hooks,
                layer._backward_pre_hooks,
            )
        )
        expect(
            leftover == 0,
            "your hooks are still registered on the layer after the function returned: keep "
            "each handle and call `handle.remove()` (a forgotten hook fires on every later pass)",
            MODULE_HOOKS,
        )
        expect(seen["calls"] > 0, "the layer never ran: call `loss_fn(model(x)).backward()` in your function")
        expect(isinstance(g, torch.Tensor), f"return a tensor, not a {type(g).__name__}")
        g = g.detach()
        shape = tuple(g.shape)
        if shape == (n_out, n_in):
            hint(
                f"shape {shape} is the gradient of the whole batch, weight.grad, the sum of the per-sample "
                f"gradients: keep one ({n_out}, {n_in}) matrix per sample, shape ({n}, {n_out}, {n_in})"
            )
        if shape == (n, n_in, n_out):
            hint(
                f"shape {shape} is transposed: nn.Linear's weight has shape (out, in), so sample i's gradient is "
                "outer(grad_output[i], input[i]), grad_output first",
                LINEAR_FUNCTION,
            )
        if shape == (n, n_in, n_in):
            hint(
                f"shape {shape}: you paired the input with a gradient of the input's size. grad_input (the "
                "backward hook's 2nd argument) is the gradient of the layer's input; the weight gradient needs "
                "grad_output (its 3rd)"
            )
        if shape == (n, n_out, x.shape[1]) and x.shape[1] != n_in:
            hint(
                f"shape {shape}: you paired grad_output with the model's input x ({x.shape[1]} features), but this "
                f"layer's input has {n_in}: keep `args[0]` in a forward hook on the layer itself"
            )
        if shape == (n, n_out, n_out):
            hint(
                f"shape {shape}: you paired grad_output with the layer's output. A forward hook gets "
                "(module, args, output): the input is args[0]"
            )
        expect(
            shape == (n, n_out, n_in),
            f"for a Linear({n_in}, {n_out}) and {n} samples the result should have "
            f"shape ({n}, {n_out}, {n_in}), not {shape}",
            BROADCASTING,
        )
        if not seen["forward"]:
            _no_forward_hook()
        if seen["deprecated"]:
            hint(DEPRECATED_HOOK, BACKWARD_HOOKS)
        if not (seen["backward"] or hooks["ran"]):
            hint(
                "no backward hook caught grad_output: take it from a full backward hook on the layer (or a tensor "
                "hook on its output), which hands it to you during the backward pass, instead of keeping the "
                "output's graph around to ask autograd for it afterwards (retain_grad, autograd.grad)",
                MODULE_HOOKS,
            )
        expect(
            runs[0] == 1,
            f"your function ran the backward pass {runs[0]} times: hooks give every sample's input and output "
            "gradient from one forward and one backward pass of the whole batch",
        )
        want = _reference(model, layer, x, per_sample_loss)
        if torch.allclose(g * n, want, rtol=1e-4, atol=1e-6) or torch.allclose(g, want * n, rtol=1e-4, atol=1e-6):
            hint(
                "off by a factor of the batch size: grad_output already holds the loss's 1/N (cross_entropy "
                "averages over the batch); use it as it is"
            )
        fewer, more = _operations(fn, model, layer, x[:3]), _operations(fn, model, layer, x)
        expect(
            fewer == more,
            f"your function runs {fewer} tensor operations for 3 samples and {more} for {n}: their number grows with "
            "the batch, so a Python loop over the samples runs somewhere. Broadcasting makes all the outer "
            "products in one operation",
            BROADCASTING,
        )
        expect(
            torch.allclose(g, want, rtol=1e-4, atol=1e-6),
            "the shape is right but the values are not: check which two tensors your hooks kept (the input of "
            "*this* layer, and the gradient of its output) and how nn.Linear's weight gradient is made from them",
            LINEAR_FUNCTION,
        )
        model.zero_grad()
        try:
            with _changed_hook_data(layer):
                handed = returns(fn, model, layer, x, loss_fn)
        finally:
            _remove_global_hooks(global_before)
        if not (isinstance(handed, torch.Tensor) and torch.allclose(handed.detach(), 6 * want, rtol=1e-4, atol=1e-5)):
            hint(
                "the values are right, but they did not come from your hooks: the check ran your function "
                "again and handed your forward hook a changed input and your backward hook a changed "
                "grad_output, and your result did not follow both. Your hooks ran for show, while the data came "
                "from elsewhere (retain_grad, autograd.grad on the output, running the layers yourself). This "
                "exercise practises module hooks: build the result from what they receive",
                MODULE_HOOKS,
            )
