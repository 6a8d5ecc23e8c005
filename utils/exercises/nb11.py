"""Checks for the exercises of notebook 11 · memory and speed (``notebooks/src/11_memory_and_speed.py``).
Used by notebook 11, whose ``Checker("11")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import contextlib
import copy
import warnings

import torch
import torch.nn.utils.fusion
import torch.utils.checkpoint
from torch import nn

from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import assigned_names, calls_to, refers_to

EXERCISES = Registry("11")

S_COUNTED = "1.1 Saved activations, counted"
S_REENTRANT = "1.3 Random numbers, and `use_reentrant`"
S_INPLACE = "2. In-place operations (原地操作)"
S_FUSION = "5. Fusing Conv and BatchNorm for inference (Conv 层和 BN 层融合)"

# Which snippets of exercise 1 raise in backward(), and why (verified on the PyTorch of course.toml).
RAISES = {"A": True, "B": False, "C": True, "D": False, "E": True, "F": False}
WHY = {  # what to look at for a misjudged snippet, not the verdict
    "A": "snippet A is misjudged: the derivative of exp is exp itself; which tensor does `exp` save for backward, "
    "and is that the one `y.add_(1)` overwrites?",
    "B": "snippet B is misjudged: sigmoid's derivative is σ(1 − σ); does its backward read the input h, which "
    "`h.mul_(2)` overwrites, or its output?",
    "C": "snippet C is misjudged: the derivative of h ** 2 is 2h; which tensor does `pow` save, and does "
    "`h.mul_(2)` overwrite it?",
    "D": "snippet D is misjudged: ReLU's backward reads y > 0; is its input h, which `h.mul_(2)` overwrites, "
    "among what it saved?",
    "E": "snippet E is misjudged: ReLU's backward reads y > 0; which tensor did it save, and which one does "
    "`y.mul_(2)` overwrite?",
    "F": "snippet F is misjudged: the derivative of h + 1 is 1 whatever h is; what does the addition need to "
    "save at all?",
}


@EXERCISES.exercise(1, "Which in-place operation breaks backward? (predict)", S_INPLACE)
def inplace_predict(answer):
    if isinstance(answer, str):
        answer = [c for c in answer if not c.isspace() and c != ","]
    expect(
        isinstance(answer, (set, list, tuple, frozenset)) and all(isinstance(a, str) for a in answer),
        'give the letters of the snippets whose backward() raises, as a set of strings, e.g. {"A", "B"}',
    )
    chosen = {a.strip().upper() for a in answer}
    unknown = sorted(chosen - set(RAISES))
    expect(not unknown, f"the snippets are A to F; {unknown} is not one of them")
    wrong = [letter for letter in sorted(RAISES) if (letter in chosen) != RAISES[letter]]
    if wrong:
        hint(
            f"{WHY[wrong[0]]} The rule: a tensor may be overwritten only if no backward formula saved it, "
            "and autograd's version counter catches the overwrite when backward() reads the saved tensor"
        )


@contextlib.contextmanager
def _saved_bytes(model):
    """The bytes of the distinct non-parameter storages autograd saves inside the block (as in section 1.1)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    result = {}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
    result["bytes"] = sum(storages.values())


def _plain(blocks, x):
    for block in blocks:
        x = block(x)
    return x


def _grads(loss, params, x):
    """The gradients that ``loss.backward()`` gives the parameters (and x), as training would read them; the
    tensors' own ``.grad`` are left as they were. (``backward``, not ``torch.autograd.grad``: the reentrant
    checkpoint does not support the latter, and the task does not ask for it.)"""
    inputs = list(params) + ([x] if x.requires_grad else [])
    before = [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    try:
        loss.backward()
        return [t.grad for t in inputs]
    finally:
        for t, g in zip(inputs, before):
            t.grad = g


def _same_grads_without_dropout(fn, blocks, x):
    """Whether the learner's function gives the plain run's gradients once Dropout draws nothing (eval mode)."""
    blocks.eval()
    try:
        params = list(blocks.parameters())
        expected = _grads(_plain(blocks, x).square().sum(), params, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _grads(fn(blocks, x).square().sum(), params, x)
        return all(a is not None and torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(got, expected))
    finally:
        blocks.train()


@EXERCISES.exercise(2, "Checkpoint every block (write a function)", S_REENTRANT)
def checkpointed(fn):
    reentrant_used = False
    for n_blocks, width, batch, x_needs_grad in ((4, 32, 8, False), (3, 16, 5, True)):
        torch.manual_seed(n_blocks)
        blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(0.2)) for _ in range(n_blocks)
        )
        x = torch.randn(batch, width, requires_grad=x_needs_grad)
        act = batch * width * 4
        params = list(blocks.parameters())
        torch.manual_seed(100)
        with _saved_bytes(blocks) as plain_saved:
            expected = _plain(blocks, x)
        expected_grads = _grads(expected.square().sum(), params, x)

        torch.manual_seed(100)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _saved_bytes(blocks) as saved, calls_to(torch.utils.checkpoint.CheckpointFunction.forward) as old:
                out = returns(fn, blocks, x)
        reentrant_used = reentrant_used or bool(old)
        said = " ".join(str(w.message) for w in caught)
        expect(
            x.requires_grad == x_needs_grad,
            "your function changed `x.requires_grad`: leave the caller's input "
            "alone; with use_reentrant=False no input needs to require grad",
        )
        if "use_reentrant parameter should be passed explicitly" in said:
            hint(
                "`checkpoint` was called without use_reentrant: PyTorch then warns and falls back to the "
                "reentrant implementation, which gives no gradient to a block whose inputs do not require grad; "
                "pass use_reentrant=False"
            )
        expect(isinstance(out, torch.Tensor), f"return the output tensor, not a {type(out).__name__}")
        expect(
            out.shape == expected.shape,
            f"the output should have shape {tuple(expected.shape)}, not "
            f"{tuple(out.shape)}: run x through every block in order",
        )
        if not out.requires_grad:
            if "None of the inputs have requires_grad=True" in said:
                hint(
                    "with use_reentrant=True the blocks run under no_grad and only inputs that require grad get a "
                    "gradient: the data does not, so nothing does; pass use_reentrant=False"
                )
            hint(
                "the output has no graph: do not run the blocks under `torch.no_grad()` or detach the result; "
                "checkpointing drops activations, not the graph"
            )
        expect(
            torch.allclose(out, expected, atol=1e-6, rtol=1e-5),
            "the output differs from running the blocks "
            "one after the other (with the same random seed): call each block once, in order",
        )
        grads = _grads(out.square().sum(), params, x)
        if any(g is None for g in grads[: len(params)]):
            hint(
                "some parameters got no gradient after backward(): the reentrant implementation "
                "(use_reentrant=True) passes gradients only to a segment's inputs that require grad; pass "
                "use_reentrant=False"
            )
        if x_needs_grad and grads[-1] is None:
            hint(
                "when x requires grad (an activation from earlier layers, not data), it gets no gradient through "
                "your function: do not detach the input, its gradient is part of the result"
            )
        if not all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(grads, expected_grads)):
            if not _same_grads_without_dropout(fn, blocks, x):
                hint(
                    "the gradients differ from the plain run even with Dropout off: backward recomputes something "
                    "else than the forward ran. A `lambda t: block(t)` written in the loop looks `block` up when "
                    "backward calls it, and by then it is the last block; give `checkpoint` the block itself"
                )
            hint(
                "the gradients differ from the plain run: the recomputation drew new Dropout masks; keep "
                "preserve_rng_state=True (the default), which replays the random generator"
            )
        if saved["bytes"] >= plain_saved["bytes"]:
            hint(
                "autograd saved as much as without checkpointing: no block's activations were dropped. Section 1.1 "
                "shows what autograd keeps of a block run through `checkpoint`",
                S_COUNTED,
            )
        if saved["bytes"] <= act:
            hint(
                "the whole chain is one checkpoint, so only x is kept; but backward then recomputes every block "
                "at once and holds all their activations again, as high a peak as without checkpointing. "
                "Checkpoint each block separately",
                S_COUNTED,
            )
        if saved["bytes"] > n_blocks * act:
            hint(
                f"autograd kept more than the {n_blocks} block inputs: some block runs without checkpoint "
                "(checkpoint_sequential, for one, leaves its last segment unwrapped)",
                S_COUNTED,
            )
        expect(
            saved["bytes"] == n_blocks * act,
            f"autograd kept less than the {n_blocks} block inputs: a checkpoint "
            "spans several blocks, whose activations backward then recomputes and holds together; checkpoint "
            "each block separately",
            S_COUNTED,
        )
    if reentrant_used:
        return (
            "You used the reentrant implementation, with an input made to require grad: it trains with "
            "backward(), but PyTorch recommends use_reentrant=False, which needs no such trick and also works with "
            "`torch.autograd.grad` (section 1.3)"
        )
    return None


def _conv_bn_cases():
    g = torch.Generator().manual_seed(11)
    # the first case has a large eps, so that a forgotten eps shows; the second has no conv bias
    for args, kwargs, eps in (
        ((3, 8, 3), {"padding": 1}, 0.1),
        ((4, 6, 3), {"stride": 2, "bias": False}, 1e-5),
        ((5, 5, 1), {}, 1e-3),
        ((4, 6, 3), {"groups": 2, "dilation": 2, "padding": 2}, 1e-5),
    ):
        conv, bn = nn.Conv2d(*args, **kwargs), nn.BatchNorm2d(args[1], eps=eps)
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.3)
            if conv.bias is not None:
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))
            bn.running_mean.copy_(torch.randn(args[1], generator=g))
            bn.running_var.copy_(torch.rand(args[1], generator=g) * 1.5 + 0.05)
            bn.weight.copy_(torch.rand(args[1], generator=g) + 0.5)
            bn.bias.copy_(torch.randn(args[1], generator=g))
        conv.eval()
        bn.eval()
        yield conv, bn, torch.randn(2, args[0], 9, 9, generator=g)


def _close(a, b):
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def _weight_hints(fused, conv, bn):
    w, b = conv.weight.detach(), (conv.bias.detach() if conv.bias is not None else torch.zeros(conv.out_channels))
    gamma, beta, mean, var = bn.weight.detach(), bn.bias.detach(), bn.running_mean, bn.running_var
    scale = gamma / torch.sqrt(var + bn.eps)
    fw = fused.weight.detach()
    if not _close(fw, w * scale.view(-1, 1, 1, 1)):
        if _close(fw, w * (gamma / torch.sqrt(var)).view(-1, 1, 1, 1)):
            hint(f"eps is missing: BatchNorm divides by sqrt(running_var + eps) (this one has eps = {bn.eps})")
        if _close(fw, w * (gamma * torch.sqrt(var + bn.eps)).view(-1, 1, 1, 1)):
            hint("the weights are multiplied by the standard deviation: BatchNorm divides by sqrt(running_var + eps)")
        if _close(fw, w / torch.sqrt(var + bn.eps).view(-1, 1, 1, 1)):
            hint("the weights lack BatchNorm's γ (bn.weight): scale = γ / sqrt(running_var + eps)")
        if w.shape[0] == w.shape[1] and _close(fw, w * scale.view(1, -1, 1, 1)):
            hint(
                "the scale is applied along the input channels: the weight has shape (out, in/groups, kh, kw), "
                "so view the per-output-channel scale as (-1, 1, 1, 1)"
            )
        hint(
            "the fused weight should be the conv weight times γ/sqrt(running_var + eps), one factor per output channel"
        )
    expect(
        fused.bias is not None,
        "the fused convolution needs a bias even when the original has none: "
        "BatchNorm's shift (β − μ·scale) becomes it",
    )
    fb = fused.bias.detach()
    if not _close(fb, (b - mean) * scale + beta):
        if _close(fb, b * scale + beta):
            hint("the bias ignores the running mean: b' = (b − running_mean) · scale + β")
        if _close(fb, (b - mean) * scale):
            hint("the bias lacks BatchNorm's β: b' = (b − running_mean) · scale + β")
        if _close(fb, b - mean + beta) or _close(fb, b - mean * scale + beta):
            hint("scale the whole difference, the conv's bias included: b' = (b − running_mean) · scale + β")
        hint("the fused bias should be (b − running_mean) · γ/sqrt(running_var + eps) + β")


FUSION_LIBRARY = (torch.nn.utils.fusion.fuse_conv_bn_weights, torch.nn.utils.fusion.fuse_conv_bn_eval)
"""Every library route to a folded convolution ends in these (torch.nn.utils re-exports them; torch.ao's
fuse_modules and torch.fx's fuse call fuse_conv_bn_eval)."""
FUSION_NAMES = (
    "fuse_conv_bn_eval",
    "fuse_conv_bn_weights",
    "fuse_conv_bn",
    "fuse_modules",
    "fuse_modules_qat",
    "utils.fusion",
    "optimization.fuse",
)
WRITE_THE_FOLDING = (
    "write the folding yourself, from section 5's formulas (W' = W · γ/√(σ² + ε) per output channel, "
    "b' = (b − μ) · γ/√(σ² + ε) + β); the exercise practises reading a convolution's weight layout and BatchNorm's "
    "eval formula, which the library call skips; compare with it afterwards"
)


@EXERCISES.exercise(3, "Fold BatchNorm into the convolution (stretch)", S_FUSION)
def fuse(fn):
    name = refers_to(fn, *(n for n in FUSION_NAMES if n not in assigned_names(fn)))
    if name:
        hint(f"your function uses the library's `{name}`: {WRITE_THE_FOLDING}")
    for conv, bn, images in _conv_bn_cases():
        before = copy.deepcopy((conv.state_dict(), bn.state_dict()))
        with torch.no_grad():
            expected = bn(conv(images))
        library = {}
        try:
            with calls_to(*FUSION_LIBRARY) as library:
                fused = returns(fn, conv, bn)
        except (TypeError, AttributeError) as err:
            if conv.bias is None and "NoneType" in str(err):
                hint(
                    "this convolution has no bias (bias=False, usual before BatchNorm), so `conv.bias` is None: "
                    "treat the missing bias as zeros, and give the fused convolution a bias of its own "
                    "(`nn.Parameter`)"
                )
            raise
        except RuntimeError as err:
            if "must match the size of tensor" in str(err) and conv.groups > 1 and "dimension 1" in str(err):
                hint(
                    f"the weights do not fit: this convolution has groups={conv.groups}, so its weight has shape "
                    f"{tuple(conv.weight.shape)}, (out, in/groups, kh, kw); a new nn.Conv2d needs the same groups "
                    "(and dilation, stride, padding), or start from a copy of `conv`"
                )
            if "must match the size of tensor" in str(err):
                hint(
                    "the per-channel scale does not broadcast against the weight: the weight has shape (out, "
                    "in/groups, kh, kw), so view the scale of the out channels as (-1, 1, 1, 1)"
                )
            raise
        if library:
            hint(f"your function ran the library's `{next(iter(library))}`: {WRITE_THE_FOLDING}")
        after = (conv.state_dict(), bn.state_dict())
        changed = [
            f"{kind}.{key}"
            for kind, old, new in (("conv", before[0], after[0]), ("bn", before[1], after[1]))
            for key in old
            if not torch.equal(old[key], new[key])
        ]
        expect(
            not changed,
            f"your function changed the original layers in place ({', '.join(changed)}): build new "
            "tensors; the unfused model must keep working",
        )
        expect(
            isinstance(fused, nn.Conv2d),
            f"return one nn.Conv2d, not {type(fused).__name__}: the point is one layer instead of two",
        )
        with torch.no_grad():
            out = fused(images)
            # the convolution of the returned weight and bias alone, as nn.Conv2d computes it: no forward of the
            # learner's, no hooks, no stored layer
            folded = nn.Conv2d._conv_forward(fused, images, fused.weight, fused.bias)
        if out.shape != expected.shape:
            hint(
                f"the fused convolution gives shape {tuple(out.shape)} instead of {tuple(expected.shape)}: copy "
                "kernel_size, stride, padding, dilation and groups from the original"
            )
        if _close(out, expected) and not _close(folded, expected):
            hint(
                "your convolution gives bn(conv(x)), but its weight and bias alone do not: it still runs "
                "BatchNorm after the convolution (a forward of its own, a forward hook, a stored BatchNorm). "
                "Folding means changing the weight and bias so that one plain convolution does both layers' work "
                "at inference, one pass over the data instead of two; a convolution that still calls BatchNorm "
                "saves nothing"
            )
        if _close(folded, expected) and not _close(out, expected):
            hint(
                "the weight and bias are folded right, but calling your convolution gives something else: it runs "
                "more than the convolution (a forward of its own, a forward hook); return a plain nn.Conv2d"
            )
        if _close(out, expected):
            continue
        _weight_hints(fused, conv, bn)
        hint("the fused convolution's output differs from bn(conv(x)) in eval mode")
