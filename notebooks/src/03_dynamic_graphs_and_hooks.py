# %% [markdown]
# # 03 · Dynamic computation graphs and hooks (动态计算图与钩子)
#
# When you call `loss.backward()`, what exactly does PyTorch walk through, and how can you watch it, or change it,
# without touching the model's code? This lesson opens the box: the **dynamic computation graph** (动态计算图)
# that PyTorch records while your code runs, the **backward pass** (反向传播) that walks it to compute each
# **gradient** (梯度), and the **hooks** (钩子) that let you plug your own functions into both.
#
# **You will learn to**
#
# - explain what autograd records: a graph of backward nodes (not tensors), rebuilt on every forward pass, and
#   decided by ordinary Python `if`/`while`;
# - read that graph (`grad_fn`, `next_functions`, `AccumulateGrad`) and say where the chain rule adds up the
#   contributions of several paths;
# - predict which tensors keep a `.grad` (**leaf tensors** (叶子节点), `retain_grad`) and what `backward()` frees
#   (the saved tensors, which `saved_tensors_hooks` lets you see);
# - look at and change gradients with tensor hooks, and the accumulated `.grad` with post-accumulate hooks;
# - stop recording with `detach`, `no_grad` and `inference_mode` (and know why `eval()` is not one of them);
# - use `backward(gradient)` for non-scalar outputs, and split one backward pass in two;
# - find the operation behind an in-place error or a NaN gradient with `torch.autograd.detect_anomaly`;
# - use **module hooks** (模块钩子): forward pre-hooks, **forward hooks** (前向钩子), full **backward hooks**
#   (反向钩子) and global hooks, know how `nn.Module.__call__` runs them, and why full backward hooks refuse
#   in-place layers;
# - print shapes layer by layer, capture each layer's **activation** (激活值) and monitor gradient norms with hooks;
# - export a model graph to TensorBoard, and draw the autograd graph yourself.
#
# **Before this notebook:** tensors, views and broadcasting (notebook 01); `backward()`, `torch.autograd.grad`, the
# vector-Jacobian product and a small network built from `nn.Linear`, `nn.Sequential` and an optimizer
# (notebook 02).
#
# **Study time:** about 150 min (35 of them for the exercises).
#
# **On a GPU.** The models and their inputs go to `get_device()`; every graph, hook and error below behaves the same
# on CUDA (the graph nodes have the same names), only the numbers drawn from the random generator differ. The tiny
# scalar examples stay on the CPU on purpose: they are about autograd, not speed.
#
# This lesson grew out of a teacher's study notes on autograd (in Chinese, written for PyTorch 1.x). You do not need
# them: where they say something that no longer holds, the last section lists it, for readers who have them.

# %%
# Opened alone? (单独打开) In the course's own folder this cell does nothing. Opened alone (in Colab, or
# downloaded without the rest of the course), it fetches the course (its helpers, data and pinned packages) from
# COURSE and runs this notebook inside it.
try:
    import utils.syllabus  # noqa: F401 - the course's helpers: found when this notebook runs in its course
except ModuleNotFoundError:
    import os
    from pathlib import Path
    from urllib.request import urlopen

    COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", "").rstrip("/").removesuffix(".git")
    beside = Path.cwd().parent / "tools" / "opened_alone.py"  # the course is here, but not installed
    if not (beside.is_file() or COURSE):
        raise ModuleNotFoundError(
            "opened without its course, which names no repository to fetch it from: set the environment variable "
            "TORCH_COURSE_REPOSITORY to the course's location (a GitHub address), or get the whole course"
        ) from None
    raw = "/raw/HEAD" if COURSE.startswith("https://github.com/") else ""
    code = beside.read_bytes() if beside.is_file() else urlopen(f"{COURSE}{raw}/tools/opened_alone.py").read()
    exec(code, {"__name__": "opened_alone", "COURSE": COURSE})

# %% [markdown]
# ## Setup
#
# From the course's `utils` package: `seed_everything(0)` makes the random draws repeatable; `get_device()` picks
# CUDA, then Apple MPS, then the CPU; `fmt` prints a tensor's numbers rounded to 4 decimals; `plot_curves` and
# `plot_image_grid` draw the figures; `REPO_ROOT` and `relpath` locate the folder the lesson writes to.
#
# **How this lesson shows errors and warnings.** Many cells below raise an error on purpose, because the error is
# the lesson. `expect_error(fn)`, defined below, is plain Python: it runs `fn()` inside `try`/`except`, prints the
# error's type and first sentence, and returns the error so that the cell can check more of it (it fails loudly if
# nothing is raised). A **warning** is a message, not an error: Python prints it once to stderr and carries on, and
# a strict test run may turn it into an error or hide it. When a warning is the lesson, the cell calls
# `show_warning(fn, category, match)` from `utils`, which records every warning `fn()` raises, prints the first one
# of that category whose text contains `match`, and fails if there is none. Its core is worth copying into your own
# tests:
#
# ```python
# with warnings.catch_warnings(record=True) as caught:
#     warnings.simplefilter("always")  # record every warning, whatever the filters outside
#     result = fn()
# found = [w for w in caught if issubclass(w.category, category) and match in str(w.message)]
# # ... fail if found is empty; print found[0]'s category and first sentence; return result
# ```

# %%
import inspect
import shutil
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from utils import REPO_ROOT, fmt, get_device, plot_curves, plot_image_grid, relpath, seed_everything, show_warning

seed_everything(0)
device = get_device()
RUN_DIR = REPO_ROOT / "runs" / "03_dynamic_graphs_and_hooks"


def expect_error(fn, error_type=RuntimeError):
    """Run fn(), check it raises error_type, print the error's name and first sentence, return the error."""
    try:
        fn()
    except error_type as err:
        first = str(err).split(". ")[0].rstrip(".")
        print(f"{type(err).__name__}: {first}.")
        return err
    raise AssertionError(f"expected {error_type.__name__}, nothing was raised")


print("device:", device.type)
assert 'warnings.simplefilter("always")' in inspect.getsource(show_warning)  # the core shown above

# %% [markdown]
# ## 1. The forward pass runs eagerly (正向传播立即执行)
#
# While you compute with tensors that require grad, autograd records a graph. Its nodes are **backward nodes**
# (反向节点), not tensors: one node per recorded operation (the result's `grad_fn`, e.g. `MulBackward0`, which knows
# how to compute that operation's gradients), plus one `AccumulateGrad` node per leaf that requires grad (it writes
# the leaf's `.grad`). Edges (`next_functions`) lead from a node to the nodes of the operation's inputs. Tensors hang
# *off* the graph: a result points to the node that made it, and a node keeps the tensors it saved for backward.
# Section 2 walks this structure by hand.
#
# The graph is **dynamic** in two senses. The first: **every statement runs at once** and adds its nodes to the
# graph as it goes. There is no separate "build the graph, then run it" phase: `Y_hat` below holds numbers as soon
# as its line has run, before `loss` even exists. (The second sense, the graph being freed after `backward()`, is
# section 3.) To print a value, use `.item()` for a number or `.detach()` for a tensor; older code writes
# `loss.data`, a legacy back door that section 6 explains.

# %%
w = torch.tensor([[3.0, 1.0]], requires_grad=True)
b = torch.tensor([[3.0]], requires_grad=True)
X = torch.randn(10, 2)
Y = torch.randn(10, 1)

Y_hat = X @ w.t() + b  # computed right now, not when `loss` is defined
print("Y_hat[:3] =", fmt(Y_hat[:3].detach().flatten()))
assert np.allclose(Y_hat.detach().numpy(), X.numpy() @ np.array([[3.0], [1.0]]) + 3.0, atol=1e-6)

loss = torch.mean(torch.pow(Y_hat - Y, 2))
print("loss =", f"{loss.item():.4f}")
print("loss was made by", type(loss.grad_fn).__name__, "- the graph was recorded while computing")

# %% [markdown]
# Because the graph is recorded while ordinary Python runs, `if`/`while` decide **which** operations are recorded,
# and the graph can be different on every call. Below, a loop doubles `y` until its norm reaches 10: a small input
# loops more often, so its graph holds more multiplications, and the gradient `dz/dx = 2**k` tells how many.
# **Predict first:** how many doublings for a start of 0.1, and for 3.0?


# %%
def grow(x):
    y, k = x, 0
    while y.norm() < 10:  # data-dependent loop: a static graph could not express this directly
        y = y * 2
        k += 1
    return y.sum(), k


for start in (0.1, 3.0):
    x = torch.tensor([start, start], requires_grad=True)
    z, k = grow(x)
    z.backward()
    print(f"start={start}: {k} doublings recorded, dz/dx = {fmt(x.grad)}")
    assert torch.equal(x.grad, torch.full((2,), 2.0**k))

z_first, _ = grow(x)
z_again, _ = grow(x)
print("the same call twice records two graphs:", z_first.grad_fn is not z_again.grad_fn)
assert z_first.grad_fn is not z_again.grad_fn

# %% [markdown]
# **Static and dynamic graphs.** Frameworks with a **static graph** (静态图), such as TensorFlow 1.x and Caffe, had
# you declare the whole graph first and then run it many times. A graph known in advance is built once and can
# be optimised as a whole: for example, a convolution and the ReLU after it can be fused into one kernel that reads
# and writes memory once. PyTorch's dynamic graph costs a little bookkeeping per operation, and in exchange lets
# ordinary Python (loops, `if`, `print`, a debugger) decide and inspect the computation. Speed depends mostly on the
# kernels underneath (the matrix-product and convolution libraries), not on the kind of graph, and the line has
# blurred: `torch.compile` (notebook 11) captures a graph from your eager code and fuses operations, keeping the
# eager program as the definition of what to compute.

# %% [markdown]
# ## 2. `grad_fn` chains and `next_functions`
#
# Every tensor produced by a differentiable operation remembers the node that will compute its gradient,
# `tensor.grad_fn` (named after the operation: `MulBackward0`, `PowBackward0`, ...). Each node lists the nodes
# of its inputs in `next_functions`, a tuple of `(node, output_number)` pairs, one per input; walking those
# pairs from the loss reaches every tensor that needs a gradient. The walk stops at `AccumulateGrad` nodes, one per
# leaf tensor that requires grad: they add the incoming gradient into that tensor's `.grad` (their `.variable` is
# the tensor). An input that needs no gradient (a constant) shows up as `None`.
#
# A small example: `y1 = x + 1`, `y2 = 2 * x`, `loss = (y1 - y2) ** 2`. We print node names with
# `type(fn).__name__` rather than `print(fn)`, whose repr contains a memory address that changes on every run.


# %%
def node_label(fn, names=None):
    """A node's class name; for AccumulateGrad, also the name of the leaf tensor it fills."""
    label = type(fn).__name__
    if hasattr(fn, "variable") and names is not None:
        label += f"({names.get(id(fn.variable), '?')})"
    return label


def print_chain(fn, names=None, indent=0):
    """Print the backward graph below fn as an indented tree (a node reached twice is printed twice)."""
    print("    " * indent + node_label(fn, names))
    for child, _ in fn.next_functions:
        if child is None:
            print("    " * (indent + 1) + "None (input needs no gradient)")
        else:
            print_chain(child, names, indent + 1)


x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2

print_chain(loss.grad_fn, names={id(x): "x"})
sub = loss.grad_fn.next_functions[0][0]
add_node, mul_node = sub.next_functions[0][0], sub.next_functions[1][0]
assert add_node is y1.grad_fn and mul_node is y2.grad_fn
assert add_node.next_functions[0][0] is mul_node.next_functions[0][0]  # ONE AccumulateGrad node for x, reached twice
assert add_node.next_functions[0][0].variable is x

# %% [markdown]
# `x` has a single `AccumulateGrad` node, reached along two paths. Here is what `loss.backward()` does, step by step:
# the loss gets gradient 1; `PowBackward0` and `SubBackward0` turn it into gradients for `y1` and `y2` ($-4$ and
# $4$); `AddBackward0` and `MulBackward0` turn those into two contributions for `x`, $-4 \cdot 1$ and $4 \cdot 2$.
#
# **Where are the two contributions added?** Not in `x.grad`, as many tutorials say. The engine waits until every
# path into a node has delivered, sums the contributions in that node's **input buffer** (输入缓冲区), and then runs
# the node **once** with the total, $-4 + 8 = 4$: the sum over paths that the **chain rule** (链式法则) prescribes.
# So a hook on `x`, and a pre-hook on its `AccumulateGrad` node (`node.register_prehook(fn)` calls `fn` with the
# gradients about to enter the node), each fire once and see 4, never $-4$ and $8$ apart. Adding into `.grad` is a
# different mechanism: accumulation *across* `backward()` calls (section 3). **Predict first:** how many times
# will each hook below fire, and with which values?

# %%
calls = []
x.register_hook(lambda grad: calls.append(("tensor hook on x", grad.item())))
accumulate_x = add_node.next_functions[0][0]
accumulate_x.register_prehook(lambda grad_outputs: calls.append(("AccumulateGrad pre-hook", grad_outputs[0].item())))
loss.backward()
print("calls:", calls)
print("x.grad =", fmt(x.grad))
assert calls == [("tensor hook on x", 4.0), ("AccumulateGrad pre-hook", 4.0)]  # once each, with the sum
assert x.grad.item() == -4.0 * 1 + 4.0 * 2

# %% [markdown]
# A second example makes the same point with three weights: `l1 = input * w1` is used twice (in
# `l2 = l1 + w2` and `l3 = l1 * w3`), so `w1`'s gradient is a sum over two paths. With `input` a 2×2 block of ones,
# $w_1=2, w_2=3, w_3=4$ and `loss = (l2 * l3).mean()`, all four elements are equal ($l_1 = 2$, $l_2 = 5$,
# $l_3 = 8$, $l_4 = 40$), so the mean has the gradients of one element. By hand, the path through `l2` gives
# $l_3 = 8$ and the path through `l3` gives $l_2 w_3 = 20$, so $\partial loss/\partial w_1 = 20 + 8 = 28$,
# $\partial loss/\partial w_2 = l_3 = 8$ and $\partial loss/\partial w_3 = l_1 l_2 = 10$.
#
# `print_tensor` prints a tensor's value, `.grad`, `grad_fn` and `is_leaf`, before and after `backward()`. It
# prints `t.detach()`, not `t.data` (the same values, without the legacy back door of section 6), the `grad_fn`'s
# class name, not its address, and reads `.grad` of leaves only: reading `.grad` of a non-leaf (`l1` ... `loss`)
# returns `None` *with a warning* (section 4). The input is named `inp`, so as not to hide Python's built-in
# `input`. Expect every `grad` to be `None` before, then `tensor(28.)`, `tensor(8.)`, `tensor(10.)` for the three
# leaves.


# %%
def print_tensor(name, t):
    """Value, .grad (leaves only), grad_fn class, is_leaf."""
    grad = t.grad if t.is_leaf else None  # non-leaves keep no .grad; reading it would warn
    fn = type(t.grad_fn).__name__ if t.grad_fn is not None else None
    print(f"{name}:", t.detach(), grad, fn, t.is_leaf)


inp = torch.ones(2, 2)
w1, w2, w3 = (torch.tensor(v, requires_grad=True) for v in (2.0, 3.0, 4.0))
l1 = inp * w1
l2 = l1 + w2
l3 = l1 * w3
l4 = l2 * l3
three_loss = l4.mean()  # `loss` stays the graph of the cells above (section 3 uses it)
tensors = {"w1": w1, "w2": w2, "w3": w3, "l1": l1, "l2": l2, "l3": l3, "l4": l4, "loss": three_loss}
print("before backward():")
for name, t in tensors.items():
    print_tensor(name, t)
assert all(t.grad is None for t in (w1, w2, w3))

w1_calls = []
w1.register_hook(lambda grad: w1_calls.append(grad.item()))
three_loss.backward()
print("after backward():")
for name, t in tensors.items():
    print_tensor(name, t)
print("hook on w1 fired", len(w1_calls), "time(s), with", w1_calls)
assert (w1.grad.item(), w2.grad.item(), w3.grad.item()) == (28.0, 8.0, 10.0)
assert [t.detach().unique().item() for t in (l1, l2, l3, l4, three_loss)] == [2.0, 5.0, 8.0, 40.0, 40.0]
assert [t.is_leaf for t in tensors.values()] == [True] * 3 + [False] * 5
assert w1_calls == [28.0]  # one call with the sum of both paths (20 + 8), not two

# %% [markdown]
# ## 3. The graph is freed after `backward` (计算图在反向传播后立即销毁)
#
# You met this error in notebook 02; here we look at what exactly is freed. The second sense of "dynamic": after
# `backward()` (or `torch.autograd.grad`) each **saved tensor** (保存的张量) of the graph, an intermediate value a
# backward function needs (here `PowBackward0` saved `y1 - y2`), is freed to save memory, and the next forward pass
# records a new graph. A second `backward()` through the same graph fails. Pass `retain_graph=True` to keep the saved
# tensors; then each `backward()` adds into `.grad` once more (gradients accumulate until you zero them).

# %%
expect_error(loss.backward)  # the loss from the previous section was already back-propagated once
expect_error(lambda: loss.grad_fn._saved_self)  # the value PowBackward0 saved is gone

x = torch.tensor(3.0, requires_grad=True)
loss = ((x + 1) - 2 * x) ** 2
loss.backward(retain_graph=True)  # keep the saved tensors for one more pass
loss.backward()  # the second pass works, and frees them
print("x.grad after two backward passes:", fmt(x.grad))
assert x.grad.item() == 2 * 4.0  # 4 + 4: accumulated, not overwritten

# %% [markdown]
# Precisely, what is freed is the saved data, not the node objects: a graph whose nodes saved nothing
# (additions and sums need no saved value) can even be back-propagated twice without `retain_graph`.
# Do not rely on that; it is a detail of which operations save what. `torch.autograd.grad` frees the graph
# in the same way as `backward`, and it *returns* gradients instead of adding them into `.grad`.

# %%
x = torch.tensor(3.0, requires_grad=True)
s = (x + 1).sum()
s.backward()
s.backward()  # AddBackward0 and SumBackward0 saved no tensors: nothing was freed
print("x.grad =", fmt(x.grad))
assert x.grad.item() == 2.0

x = torch.tensor(3.0, requires_grad=True)
y = x**3
(dy_dx,) = torch.autograd.grad(y, x, retain_graph=True)
print("autograd.grad: dy/dx =", fmt(dy_dx), "| x.grad is still", x.grad)
assert dy_dx.item() == 27.0 and x.grad is None
(dy_dx_again,) = torch.autograd.grad(y, x)  # allowed once more thanks to retain_graph=True above
assert dy_dx_again.item() == 27.0
err = expect_error(lambda: torch.autograd.grad(y, x))  # now the saved x is gone

# %% [markdown]
# **Seeing what is saved: `saved_tensors_hooks`.** You can watch every saved tensor go in and out. Inside
# `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):`, each time an operation saves a tensor for
# backward, autograd calls `pack(tensor)` and keeps whatever `pack` returns; whenever the tensor is needed again
# (by `backward()`, or when you read `_saved_self`), it calls `unpack(kept)`, even after the `with` block has ended.
# For the loss of section 2 the hooks see exactly one tensor, `y1 - y2 = -2`: the addition saves nothing, and the
# multiplication `2 * x` saves only its Python scalar `2`, which the hooks do not see. (*Optional detail:* Python runs
# `2 * x` as `x.__rmul__(2)`, that is `torch.mul(x, 2)`, so `x` is the multiplication's `self` and the `2` its
# `other`, kept as `_saved_other`; it is kept as a *wrapped number*, a 0-d tensor autograd makes from a Python
# number, and saved-tensor hooks never see those. A tensor constant, `x * torch.tensor(2.0)`, would be packed.)
# Returning something other than the tensor itself is how memory-saving tools work:
# **offloading** moves the tensor to CPU memory in `pack` and back in `unpack`, and activation checkpointing keeps
# nothing and recomputes it. Notebook 11 uses these hooks to measure how much a model saves.

# %%
x = torch.tensor(3.0, requires_grad=True)
packed, unpacked = [], []


def pack(t):
    packed.append(t.item())
    return t  # what autograd keeps


def unpack(kept):
    unpacked.append(kept.item())
    return kept  # what the backward function receives


with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y1 = x + 1
    y2 = 2 * x
    loss = (y1 - y2) ** 2
print("packed while recording:", packed)
print("PowBackward0's saved value:", loss.grad_fn._saved_self.item(), "| unpacked so far:", unpacked)
scalar_saved = y2.grad_fn._saved_other.item()  # read before backward() frees it
print("MulBackward0 of 2 * x saved the scalar", scalar_saved, "without packing it")
loss.backward()
print("unpacked after backward():", unpacked)
assert packed == [-2.0] and unpacked == [-2.0, -2.0]
packed.clear()
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    x * torch.tensor(2.0)
print("x * torch.tensor(2.0) packs:", packed)
assert scalar_saved == 2 and packed == [2.0]

# %% [markdown]
# ## 4. Leaf and non-leaf tensors (叶子节点与非叶子节点), `retain_grad`
#
# A *leaf tensor* is one no recorded operation produced: you created it (for example a parameter). By
# convention every tensor with `requires_grad=False` is also a leaf; `requires_grad=True` is the condition for a
# leaf to *receive* a `.grad`, not for being a leaf. After `backward()` only leaves that require grad get their
# `.grad` filled; intermediate (non-leaf) results pass their gradient on and keep nothing, which saves memory, since
# you almost always want the gradients of what you created. Reading `.grad` of a non-leaf returns `None`, and
# PyTorch warns about it. **Predict first:** which of `x`, `y1`, `y2`, `loss` and a constant are leaves?

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
loss.backward()

for name, t in {"x": x, "y1": y1, "y2": y2, "loss": loss, "constant": torch.ones(2)}.items():
    print(f"{name:8s} is_leaf={t.is_leaf!s:5s} requires_grad={t.requires_grad}")
non_leaf_grads = show_warning(lambda: (y1.grad, y2.grad, loss.grad), UserWarning, "not a leaf Tensor")
print("y1.grad, y2.grad, loss.grad:", non_leaf_grads, "| x.grad:", fmt(x.grad))
assert non_leaf_grads == (None, None, None)  # non-leaves keep no gradient
assert x.grad.item() == 4.0
assert torch.ones(2).is_leaf  # requires_grad=False: a leaf by convention

# %% [markdown]
# A classic trap: a conversion right after creation makes a **non-leaf**. `torch.randn(3, requires_grad=True).double()`
# (or `.to("cuda")`) returns the result of an operation; the real leaf is the hidden float tensor, and your
# variable never gets a `.grad`. Create the tensor with the right `dtype=`/`device=` instead.

# %%
bad = torch.randn(3, requires_grad=True).double()  # the leaf is the float32 tensor we did not keep
good = torch.randn(3, dtype=torch.float64, device=device, requires_grad=True)
(bad.sum() + good.sum()).backward()
print("bad.is_leaf:", bad.is_leaf, "| good.is_leaf:", good.is_leaf, "| good.grad:", fmt(good.grad))
assert show_warning(lambda: bad.grad, UserWarning, "not a leaf Tensor") is None
assert torch.equal(good.grad.cpu(), torch.ones(3, dtype=torch.float64))

# %% [markdown]
# To keep the gradient of an intermediate result, call `retain_grad()` on it **before** `backward()`.
# Its `.grad` is then filled like a leaf's ($\partial\,loss/\partial\,y_1 = 2(y_1 - y_2) = -4$,
# $\partial\,loss/\partial\,y_2 = 4$, $\partial\,loss/\partial\,loss = 1$).

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
for t in (y1, y2, loss):
    t.retain_grad()
loss.backward()
print(
    "loss.grad =", fmt(loss.grad), "| y1.grad =", fmt(y1.grad), "| y2.grad =", fmt(y2.grad), "| x.grad =", fmt(x.grad)
)
assert (loss.grad.item(), y1.grad.item(), y2.grad.item(), x.grad.item()) == (1.0, -4.0, 4.0, 4.0)
assert y1.retains_grad and not y1.is_leaf

# %% [markdown]
# ## 5. Tensor hooks: `register_hook` (钩子)
#
# A hook is a plug-in (插件): a function you hang on running code to add a feature, such as a log or a check,
# without editing that code. `tensor.register_hook(fn)` calls `fn(grad)` whenever the gradient with respect to that
# tensor is computed. For debugging it is lighter than `retain_grad()`: it lets you *look* at a gradient without
# storing it. The hooks fire in the order the backward pass reaches the tensors, and the engine runs the most
# recently created node first. **Predict first:** which of the two hooks below fires first?

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2

log = []
h1 = y1.register_hook(lambda grad: log.append(("y1", grad.item())))
h2 = y2.register_hook(lambda grad: log.append(("y2", grad.item())))
loss.backward()
for name, g in log:
    print(f"{name} grad: {g:.1f}")
assert log == [("y2", 4.0), ("y1", -4.0)]  # y2 was created after y1, so its node runs first
h1.remove()
h2.remove()  # a handle removes its hook; forgotten hooks keep firing on every later backward

# %% [markdown]
# A hook that **returns** a tensor replaces the gradient that flows on. Here a hook on `y1` multiplies its
# gradient by 3, so `x.grad = 3·(-4)·1 + 4·2 = -4` instead of 4. The same trick clips gradients per tensor,
# or, on a leaf, changes what is accumulated into `.grad`.

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
y1.register_hook(lambda grad: grad * 3)
loss.backward()
print("x.grad with y1's gradient tripled:", fmt(x.grad))
assert x.grad.item() == 3 * -4.0 + 4.0 * 2

w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
w.register_hook(lambda grad: grad.clamp(-1.0, 1.0))  # a leaf hook runs before AccumulateGrad
(10 * w).sum().backward()
print("w.grad with the clamp hook:", fmt(w.grad))
assert torch.equal(w.grad, torch.ones(3))  # 10 was clamped to 1

# %% [markdown]
# A hook on a leaf (a parameter) sees **this backward pass's** gradient, before it is added into `.grad`. To act on
# the accumulated `.grad` itself (an optimizer that steps as soon as a parameter's gradient is ready, or a log of
# what the optimizer will see), use `register_post_accumulate_grad_hook(fn)`: `fn(param)` runs after
# `AccumulateGrad` has updated `param.grad`. With two backward calls and no zeroing in between the two differ: the
# tensor hook sees 3 twice, the post-accumulate hook sees 3 and then 6.

# %%
q = torch.tensor([1.0, 2.0], requires_grad=True)
seen = []
q.register_hook(lambda grad: seen.append(("register_hook", grad.tolist())))
q.register_post_accumulate_grad_hook(lambda param: seen.append(("post_accumulate", param.grad.tolist())))
for _ in range(2):
    (3 * q).sum().backward()  # no zero_grad: the second call accumulates
for name, g in seen:
    print(f"{name:16s} sees {g}")
assert seen == [
    ("register_hook", [3.0, 3.0]),
    ("post_accumulate", [3.0, 3.0]),
    ("register_hook", [3.0, 3.0]),
    ("post_accumulate", [6.0, 6.0]),
]

# %% [markdown]
# ## 6. `requires_grad` propagation, `detach`, `no_grad` and `inference_mode`
#
# An operation's result requires grad as soon as **any** of its inputs does; only then is a `grad_fn` recorded.

# %%
a = torch.ones(2)
p = torch.ones(2, requires_grad=True)
for name, t in {"a * a": a * a, "a * p": a * p, "p * p": p * p}.items():
    fn = type(t.grad_fn).__name__ if t.grad_fn is not None else None
    print(f"{name}: requires_grad={t.requires_grad!s:5s} grad_fn={fn}")
assert not (a * a).requires_grad and (a * p).requires_grad

# %% [markdown]
# Three ways to **stop** recording, and one that does not:
#
# - `t.detach()` returns a tensor that shares `t`'s storage but is cut from the graph: `requires_grad=False`, no
#   `grad_fn`. Writing into one changes the other. For an independent copy use `t.detach().clone()`
#   (`t.clone().detach()` gives the same tensor, after recording a clone for nothing). Only the numbers are shared:
#   changing the detached tensor's *shape* in place (`t_()`, `resize_()`, `set_()`) leaves `t` as it was.
# - `with torch.no_grad():` records nothing inside the block: for evaluation and for updating parameters by hand.
#   It also works as a decorator, `@torch.no_grad()`, on a whole function.
# - `with torch.inference_mode():` goes further: in **inference mode** (推理模式) every new tensor computed inside
#   is an **inference tensor** (推理张量), which skips autograd's bookkeeping (it has no **version counter**
#   (版本计数器), section 8); a view of a normal tensor stays normal. *(Optional detail:)* Later, outside the block,
#   an inference tensor may still be an input of a recorded operation whose backward does not need to keep it
#   (`t + p`: the gradient of a sum does not depend on `t`); an operation that must **save** it for backward
#   (`t * p`, whose gradient for `p` is `t`) is refused at once, when the operation is recorded, not later at
#   `backward()`. Clone it (`t.clone()`) to get a normal tensor, as the error message says.
# - `model.eval()` is **not** one of them: it switches layers such as dropout and batch norm to their evaluation
#   behaviour, but the graph is still recorded.
#
# And not `.data`, which older code uses to print or to update weights: notebook 02 showed that edits made through
# `.data` are invisible to autograd and silently give wrong gradients. Use `.detach()`, or `.item()` for a number.

# %%
p = torch.tensor([1.0, 2.0], requires_grad=True)
q = p * 2
d = q.detach()
dc = q.detach().clone()
print(
    "detach: requires_grad",
    d.requires_grad,
    "| grad_fn",
    d.grad_fn,
    "| data address minus q's:",
    d.data_ptr() - q.data_ptr(),
)  # 0: the same memory
assert d.data_ptr() == q.data_ptr()
d[0] = 100.0  # writes into q's storage too
print("q after writing d[0] = 100:", fmt(q.detach()), "| the clone kept", fmt(dc))
assert q[0].item() == 100.0 and dc[0].item() == 2.0 and dc.data_ptr() != q.data_ptr()

m = torch.ones(2, 3, requires_grad=True)
m_detached = m.detach()
m_detached.t_()  # an in-place transpose changes the detached tensor's shape only
print("after m.detach().t_(): m", tuple(m.shape), "| the detached tensor", tuple(m_detached.shape))
assert m.shape == (2, 3) and m_detached.shape == (3, 2) and m_detached.data_ptr() == m.data_ptr()

with torch.no_grad():
    r = p * 2
print("no_grad: requires_grad", r.requires_grad, "| is_leaf", r.is_leaf, "| grad_fn", r.grad_fn)
assert not r.requires_grad and r.grad_fn is None


@torch.no_grad()
def evaluate(t):
    return t * 2


assert not evaluate(p).requires_grad and torch.is_grad_enabled()  # recording is back on after the call

# %% [markdown]
# Inference mode: `t` below is an inference tensor. Adding it to `p` is recorded and back-propagates;
# multiplying it by `p` is refused on the spot, and the error says what to do. Its clone can be saved.

# %%
with torch.inference_mode():
    t = p * 2
    p_view = p.view(2)  # a view of the normal tensor p
print("inference_mode: is_inference", t.is_inference(), "| requires_grad", t.requires_grad)
print("a view of p made inside: is_inference", p_view.is_inference())
assert t.is_inference() and not p_view.is_inference()
expect_error(lambda: t._version)
p.grad = None
(t + p).sum().backward()  # allowed: AddBackward0 saves nothing, so t can take part
print("t + p: backward ran, p.grad =", fmt(p.grad))
assert torch.equal(p.grad, torch.ones(2))
err = expect_error(lambda: t * p)  # refused when recorded: MulBackward0 would have to save t
print("the message goes on:", str(err).split(". ", 1)[1])
assert str(err).startswith("Inference tensors cannot be saved for backward.")
p.grad = None
(t.clone() * p).sum().backward()  # the clone is a normal tensor: it can be saved
print("t.clone() * p: backward ran, p.grad =", fmt(p.grad))
assert torch.equal(p.grad, t)

# %% [markdown]
# And `eval()`, which records the graph as usual: only `no_grad` turns recording off. The model below is an
# `nn.Sequential` (notebook 02) of a linear layer and `nn.Dropout(0.5)`, a layer that, while training, zeroes each
# value with probability 0.5 and doubles the others, and lets everything through unchanged after `.eval()`
# (notebook 04 trains with it). `.to(device)` moves the model's parameters to the device.

# %%
dropout_model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).to(device).eval()
inp = torch.ones(1, 2, device=device)
print("eval() output requires_grad:", dropout_model(inp).requires_grad)
with torch.no_grad():
    print("eval() + no_grad output requires_grad:", dropout_model(inp).requires_grad)
assert dropout_model(inp).requires_grad

# %% [markdown]
# ## 7. `backward(gradient)` and splitting a backward pass in two
#
# A reminder from notebook 02: for a non-scalar output `y`, `y.backward(gradient=v)` (with `v` shaped like `y`)
# computes the **vector-Jacobian product** (向量-雅可比积) $v^\top J$, the gradient of $\sum_i v_i y_i$. Older texts
# call this argument `grad_variables`: the keyword of `torch.autograd.backward(variables, grad_variables, ...)` up to
# PyTorch 0.3, when tensors that needed gradients were wrapped in `Variable` objects. Version 0.4 merged `Variable`
# into `Tensor` and renamed the keyword `grad_tensors`; 2.14 still accepts `grad_variables` as a deprecated alias and
# emits a `FutureWarning`, printed below. Today: `y.backward(gradient=v)` or
# `torch.autograd.backward(y, grad_tensors=v)`, which give the same `.grad` (asserted).

# %%
x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
y = x**2
v = torch.tensor([1.0, 0.1, 0.01])
y.backward(gradient=v)
print("x.grad = v * 2x =", fmt(x.grad))
assert torch.allclose(x.grad, v * 2 * x.detach())

x.grad = None
torch.autograd.backward(x**2, grad_tensors=v)  # today's keyword: no warning
assert torch.allclose(x.grad, v * 2 * x.detach())

x.grad = None
show_warning(lambda: torch.autograd.backward(x**2, grad_variables=v), FutureWarning, "grad_variables")
assert torch.allclose(x.grad, v * 2 * x.detach())  # the old name still works, for now

# %% [markdown]
# That is all it takes to **split one backward pass in two**. Cut the graph between two stages with
# `y.detach().requires_grad_()`: the second stage starts from a fresh leaf `y1` (`y.clone().detach()` works too, but
# copies the data for nothing, since nobody writes into `y1`). Back-propagate the second stage first; `y1.grad` is
# then exactly the gradient that must enter the first stage, so `y.backward(y1.grad)` finishes the job. The result
# equals one end-to-end backward. This is what pipeline-parallel training does when its stages live on different
# devices or processes.

# %%
w = torch.tensor([1.0, 2.0], requires_grad=True)
x = torch.tensor([3.0, 4.0])


def step1(x):
    return torch.matmul(w, x)


def step2(x):
    return torch.sum(x)


step2(step1(x)).backward()  # end to end
end_to_end = w.grad.clone()

w.grad = None
y = step1(x)
y1 = y.detach().requires_grad_(True)  # a new leaf: the graph is cut here
z = step2(y1)
z.backward()  # stage 2 only: fills y1.grad
y.backward(y1.grad)  # stage 1, fed with the gradient stage 2 produced
print("end to end:", fmt(end_to_end), "| in two steps:", fmt(w.grad))
assert torch.equal(w.grad, end_to_end) and torch.equal(w.grad, x)

# %% [markdown]
# The same with real layers: a linear layer + `tanh` as stage 1, a mean-squared-error loss as stage 2
# (`F.mse_loss(a, b)`, the mean of the squared differences: the function form of notebook 02's `nn.MSELoss`), and a
# non-scalar cut `y` (a batch of 4×3 activations), so `y1.grad` is a full tensor, not just 1.

# %%
seed_everything(0)
stage1 = nn.Sequential(nn.Linear(5, 3), nn.Tanh()).to(device)
xb, target = torch.randn(4, 5, device=device), torch.randn(4, 3, device=device)

F.mse_loss(stage1(xb), target).backward()
reference = [p.grad.clone() for p in stage1.parameters()]
stage1.zero_grad()

y = stage1(xb)
y1 = y.detach().requires_grad_()
F.mse_loss(y1, target).backward()
print("gradient passed between the stages:", tuple(y1.grad.shape))
y.backward(y1.grad)
gaps = [(p.grad - ref).abs().max().item() for p, ref in zip(stage1.parameters(), reference)]
print(f"two-step vs end-to-end gradients: {len(gaps)} parameters, largest difference {max(gaps):.1e}")
assert max(gaps) <= 1e-6  # the same computation, split in two

# %% [markdown]
# ## 8. In-place operations that break autograd (原地操作)
#
# ### 8.1 The version counter
#
# An **in-place operation** (原地操作: `x.add_(1)`, `x[0] = ...`, `inplace=True`) overwrites a tensor's memory. Autograd
# allows it only when no backward function still needs the old value. It keeps a *version counter* on every tensor
# (`t._version`, bumped by each in-place write); each saved tensor remembers the version it was saved at, and `backward`
# raises if they differ. Two errors you will meet:
#
# 1. writing in place into a **leaf that requires grad**: refused immediately (wrap manual weight updates in
#    `torch.no_grad()`);
# 2. overwriting a value that a backward function saved: refused at `backward` time.

# %%
w = torch.tensor([1.0, 2.0], requires_grad=True)
expect_error(lambda: w.add_(1))
with torch.no_grad():
    w.add_(1)  # fine: this is how an optimizer step updates parameters
print("w after the no_grad update:", fmt(w.detach()))

s = w.sigmoid()  # SigmoidBackward0 saves its output s
print("version of s before:", s._version)
s.mul_(2)
print("version of s after s.mul_(2):", s._version)
err = expect_error(lambda: s.sum().backward())
assert "modified by an inplace operation" in str(err) and "is at version 1; expected version 0" in str(err)
print("the message ends:", str(err).split("Hint: ")[1])

# %% [markdown]
# A common memory tip is to make every ReLU in place (`nn.ReLU(inplace=True)`, or `F.relu(x, inplace=True)`). What
# it saves is a temporary: out of place, a ReLU's input and its result exist side by side for a moment, which
# raises the peak memory. What backward keeps is the same either way, since the input is freed right after the
# ReLU (the cell counts the bytes saved for backward with the hooks of section 3: 48 bytes either way, the 2 × 3
# float32 input `xb`, which the linear layer keeps for its weight's gradient, and the ReLU's 2 × 3 output). It is safe exactly when the
# overwritten tensor is not needed for backward. ReLU's derivative can be read from its *output* (`output > 0`),
# and a linear layer saves its *inputs*, not its output, so Linear → ReLU(inplace) is safe and gives the same
# gradients. Sigmoid saves its output, so Sigmoid → ReLU(inplace) destroys what sigmoid needs. (Section 9.4 shows
# one more place where in-place ReLUs fail.)

# %%
seed_everything(0)
lin = nn.Linear(3, 3).to(device)
xb = torch.randn(2, 3, device=device)

F.relu(lin(xb)).sum().backward()
ref = lin.weight.grad.clone()
lin.zero_grad()
F.relu(lin(xb), inplace=True).sum().backward()
gap = (lin.weight.grad - ref).abs().max().item()
print(f"Linear -> ReLU(inplace): largest difference from the out-of-place gradient {gap:.1e}")
assert gap <= 1e-6


def bytes_saved_for_backward(inplace):
    storages = {}  # one entry per memory block, however many saved tensors share it

    def pack_size(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_size, lambda t: t):
        F.relu(lin(xb), inplace=inplace).sum()
    return sum(storages.values())


saved = {inplace: bytes_saved_for_backward(inplace) for inplace in (False, True)}
print("bytes saved for backward: ReLU out of place", saved[False], "| in place", saved[True])
assert saved[False] == saved[True]

err = expect_error(lambda: F.relu(torch.sigmoid(lin(xb)), inplace=True).sum().backward())

# %% [markdown]
# ### 8.2 Which operation? `torch.autograd.detect_anomaly` (异常检测)
#
# The errors above name a backward node, `SigmoidBackward0`, not a line of your code: in a model with hundreds of
# operations that does not tell you *which* sigmoid. The hint at the end of the message names the tool, **anomaly
# detection** (异常检测). Inside `with torch.autograd.detect_anomaly():` (or after
# `torch.autograd.set_detect_anomaly(True)`), autograd does two extra things:
#
# 1. at every recorded operation it stores the Python **traceback** of the forward call; when a backward node fails,
#    it prints that traceback as a warning (*"Error detected in SigmoidBackward0. Traceback of forward call that
#    caused the error"*), so you see the line of *forward* code that created the failing node;
# 2. it checks every gradient a backward node returns for NaN and raises at the first one (*"Function
#    'SqrtBackward0' returned nan values in its 0th output"*), so a NaN is caught where it is born, not many layers
#    later in `.grad`.
#
# `anomaly_report` below runs a backward pass under anomaly detection and returns the error, the warning's first
# line and the last line of code in its traceback (the frames above it belong to Jupyter).


# %%
def anomaly_report(fn):
    """Run fn() under detect_anomaly: return (the error, the report's first line, the forward line it names)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly():
            err = expect_error(fn)
    report = next(str(warning.message) for warning in caught if "Error detected in" in str(warning.message))
    code_lines = [line.strip() for line in report.splitlines() if line.startswith("    ")]
    return err, report.splitlines()[0], code_lines[-1]


w = torch.tensor([1.0, 2.0], requires_grad=True)


def forward_with_inplace_bug(w):
    s = w.sigmoid()
    s.mul_(2)  # overwrites what SigmoidBackward0 saved
    return s.sum()


err, first, line = anomaly_report(lambda: forward_with_inplace_bug(w).backward())
print(first)
print("    " + line)
assert first == "Error detected in SigmoidBackward0. Traceback of forward call that caused the error:"
assert line == "s = w.sigmoid()"

# %% [markdown]
# The second use is NaN. A classic case: `torch.where(x > 0, torch.sqrt(x), 0)` looks safe, and its forward result
# is finite everywhere, yet its gradient is NaN at every negative `x`. Backward does not skip the branch that `where`
# did not pick: `WhereBackward0` sends a gradient of 0 to `sqrt`'s output there, and `SqrtBackward0` multiplies it by
# $1/(2\sqrt{x})$, which is NaN for $x < 0$; $0 \cdot \text{NaN} = \text{NaN}$. Anomaly detection stops at
# `SqrtBackward0` and names the forward line. The fix: never compute `sqrt` where it is not finite, by feeding it a
# harmless value there (a second `where`).

# %%
x = torch.tensor([4.0, -1.0], requires_grad=True)


def guarded_sqrt(x):
    return torch.where(x > 0, torch.sqrt(x), 0.0)  # finite output, NaN gradient at x < 0


guarded_sqrt(x).sum().backward()
print("output:", fmt(guarded_sqrt(x)), "| gradient:", fmt(x.grad))
assert torch.isfinite(guarded_sqrt(x)).all() and torch.isnan(x.grad[1])

x.grad = None
err, first, line = anomaly_report(lambda: guarded_sqrt(x).sum().backward())
print(first)
print("    " + line)
assert "returned nan values in its 0th output" in str(err) and "SqrtBackward0" in first


def fixed_sqrt(x):
    return torch.where(x > 0, torch.sqrt(torch.where(x > 0, x, 1.0)), 0.0)  # sqrt only sees positive values


x.grad = None
fixed_sqrt(x).sum().backward()
print("fixed: output", fmt(fixed_sqrt(x)), "| gradient:", fmt(x.grad))
assert torch.equal(x.grad, torch.tensor([0.25, 0.0]))

# %% [markdown]
# **The cost.** Anomaly detection is for debugging only, and PyTorch says so with a warning when you turn it on.
# Every recorded node stores a Python traceback (below: the node's `metadata`, the dictionary where anomaly mode
# keeps it), which costs far more than a small operation itself, and every backward node's output is scanned for
# NaN, which on a GPU also makes the CPU wait for the GPU at every node. `detect_anomaly(check_nan=False)` keeps the
# tracebacks and skips the scan, which is all an in-place error needs (the error's own hint suggests it). The timing
# below (ten forward and backward passes of a small **multi-layer perceptron** (多层感知机), or MLP: two linear
# layers with a `tanh` between them; the best of five tries) varies with the machine, so its printed numbers are not
# compared. For a model this small the slowdown is ten times or more on a CPU and about 3 times on a large GPU, where
# each step already spends most of its time launching GPU work; it is asserted to be at least 1.5 times.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.autograd.detect_anomaly():
        traced = (w * 2).sin()
enabled = next(warning for warning in caught if "Anomaly Detection" in str(warning.message))
print(f"{enabled.category.__name__}: {enabled.message}")
frames = traced.grad_fn.metadata["traceback_"]  # one string per frame of the forward call's stack
print("SinBackward0 keeps the forward traceback; its last frame's code:", frames[-1].strip().splitlines()[-1].strip())
assert "increase the runtime" in str(enabled.message) and frames[-1].strip().endswith("traced = (w * 2).sin()")


# %%
# NBVAL_IGNORE_OUTPUT
def ten_steps(model, xs):
    start = time.perf_counter()
    for _ in range(10):
        model.zero_grad()
        F.mse_loss(model(xs), torch.zeros(len(xs), 1, device=xs.device)).backward()
    return time.perf_counter() - start


seed_everything(0)
small = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
xs = torch.randn(8, 16, device=device)
plain, anomaly = [], []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the "Anomaly Detection has been enabled" warning, shown above
    for _ in range(5):
        plain.append(ten_steps(small, xs))
        with torch.autograd.detect_anomaly():
            anomaly.append(ten_steps(small, xs))
print(f"ten steps: {min(plain) * 1e3:.1f} ms plain, {min(anomaly) * 1e3:.1f} ms under detect_anomaly")
print(f"anomaly detection made them {min(anomaly) / min(plain):.0f} times slower")
assert min(anomaly) > 1.5 * min(plain)

# %% [markdown]
# ## 9. Module hooks and how `nn.Module.__call__` runs them
#
# A **module** (模块) is an object of a class derived from `nn.Module`: its `__init__` creates the layers it uses
# (after calling `super().__init__()`), and its `forward` method computes the output. `nn.Linear` and
# `nn.Sequential` are modules; notebook 10 teaches how modules are built. For hooks, one fact matters: `model(x)`
# does not call `forward` directly. It calls `nn.Module.__call__`, which runs hooks around `forward`, in an order
# that has stayed the same since PyTorch 1.x:
#
# 1. global forward pre-hooks, then the module's forward pre-hooks, `hook(module, args)`; a hook that returns
#    something replaces the arguments;
# 2. if backward hooks exist, the inputs are wrapped so that the hooks can see their gradients during `backward`;
# 3. `forward(*args)`;
# 4. global forward hooks, then the module's forward hooks, `hook(module, args, output)`; a hook that returns
#    something replaces the output;
# 5. if backward hooks exist, the output is wrapped too, after the forward hooks: a forward hook sees the
#    unwrapped output (section 9.4 relies on it).
#
# ### 9.1 Forward hooks, on one module and on all of them
#
# Calling `model.forward(x)` yourself **skips every hook**. Global hooks (registered with
# `torch.nn.modules.module.register_module_forward_pre_hook` / `register_module_forward_hook`) fire for *every*
# module in the program: always keep the handle and remove it, here in the same cell, in a `finally`.

# %%
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
)


class Doubler(nn.Module):
    def forward(self, x):
        events.append("forward")
        return 2 * x


events = []
m = Doubler()
m.register_forward_pre_hook(lambda mod, args: events.append("pre-hook"))
m.register_forward_hook(lambda mod, args, out: events.append("forward hook"))
global_handles = [
    register_module_forward_pre_hook(lambda mod, args: events.append("global pre-hook")),
    register_module_forward_hook(lambda mod, args, out: events.append("global forward hook")),
]
try:
    m(torch.ones(1))
    print("m(x) runs:        ", events)
    assert events == ["global pre-hook", "pre-hook", "forward", "global forward hook", "forward hook"]
    events.clear()
    m.forward(torch.ones(1))
    print("m.forward(x) runs:", events)
    assert events == ["forward"]
    events.clear()
    nn.Sequential(Doubler(), Doubler())(torch.ones(1))  # hooks registered on no module of this model
    print("a Sequential of two Doublers: the global pre-hook fired", events.count("global pre-hook"), "times")
    assert events.count("global pre-hook") == 3  # the Sequential and each child
finally:
    for handle in global_handles:
        handle.remove()

# %% [markdown]
# Hooks that **return** a value change what flows through the module, without touching its code: here a pre-hook
# scales the input by 10 and a forward hook adds 1 to the output, so `Doubler` returns `2·(10·x) + 1`.
# Removing the handles restores the plain module.

# %%
events = []
m = Doubler()
pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 10,))
post = m.register_forward_hook(lambda mod, args, out: out + 1)
print("with hooks:   ", fmt(m(torch.tensor([1.0, 2.0]))))
assert torch.equal(m(torch.tensor([1.0, 2.0])), torch.tensor([21.0, 41.0]))
pre.remove()
post.remove()
print("hooks removed:", fmt(m(torch.tensor([1.0, 2.0]))))
assert torch.equal(m(torch.tensor([1.0, 2.0])), torch.tensor([2.0, 4.0]))

# %% [markdown]
# ### 9.2 Hooks see modules, not functions
#
# A layer module is a thin wrapper around a function of `torch.nn.functional`: `nn.ReLU`'s whole `forward` is one
# call of `F.relu` (its source is printed below). The function computes the same thing, but a module hook fires only
# when a **module** is called. A model that calls `F.relu` inside its `forward` therefore has no ReLU for any hook to
# see, while the same model written with `nn.ReLU()` layers has one.

# %%
print(inspect.getsource(nn.ReLU.forward))


class FunctionalMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 3)
        self.fc2 = nn.Linear(3, 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))  # F.relu: a function call, not a module


called = []
handle = register_module_forward_hook(lambda mod, args, out: called.append(type(mod).__name__))
try:
    FunctionalMLP().to(device)(torch.ones(4, 2, device=device))
    print("modules seen, F.relu in forward: ", called)
    assert called == ["Linear", "Linear", "FunctionalMLP"]
    called.clear()
    nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).to(device)(torch.ones(4, 2, device=device))
    print("modules seen, nn.ReLU as a layer:", called)
    assert called == ["Linear", "ReLU", "Linear", "Sequential"]
finally:
    handle.remove()

# %% [markdown]
# **A module called twice** shares its parameters between the two calls: nothing is copied, the graph simply uses
# the same weight tensor twice. Its forward hooks fire once per call, and the weight's gradient is the sum over both
# uses, added in the input buffer of its one `AccumulateGrad` node (section 2), so a tensor hook on the weight fires
# once. Below, the same linear layer is applied twice, with a `tanh` between; to check the sum, the same computation
# is repeated with two separate copies of the weight, using `F.linear(x, weight, bias)`, the function behind
# `nn.Linear` ($x W^\top + b$).

# %%
seed_everything(0)
shared = nn.Linear(2, 2).to(device)
xb = torch.tensor([[1.0, -1.0]], device=device)
forward_calls, weight_hook_calls = [], []
handles = [
    shared.register_forward_hook(lambda mod, args, out: forward_calls.append(tuple(out.shape))),
    shared.weight.register_hook(lambda grad: weight_hook_calls.append(grad.clone())),
]
shared(torch.tanh(shared(xb))).sum().backward()  # the same layer, used twice
for h in handles:
    h.remove()

w_first = shared.weight.detach().clone().requires_grad_()
w_second = shared.weight.detach().clone().requires_grad_()
bias = shared.bias.detach()
F.linear(torch.tanh(F.linear(xb, w_first, bias)), w_second, bias).sum().backward()
print(f"forward hook fired {len(forward_calls)} times, weight hook {len(weight_hook_calls)} time")
print("shared.weight.grad:", fmt(shared.weight.grad))
print("first use + second use:", fmt(w_first.grad + w_second.grad))
assert len(forward_calls) == 2 and len(weight_hook_calls) == 1
assert torch.allclose(shared.weight.grad, w_first.grad + w_second.grad, atol=1e-6)

# %% [markdown]
# ### 9.3 Backward hooks
#
# `register_full_backward_hook(hook)` calls `hook(module, grad_input, grad_output)` during `backward`: `grad_output`
# holds the gradients with respect to the module's outputs, `grad_input` those with respect to its **inputs** (not
# its parameters; use tensor hooks on parameters for those, section 10). For a linear layer $y = xW^\top + b$,
# `grad_input = grad_output @ W`. Returning a tuple replaces `grad_input`. (A `register_full_backward_pre_hook(hook)`,
# `hook(module, grad_output)`, fires earlier, before the module's input gradients are computed, and may replace
# `grad_output`.)

# %%
seed_everything(0)
layer = nn.Linear(3, 2).to(device)
xb = torch.randn(4, 3, device=device, requires_grad=True)
seen = {}


def record(module, grad_input, grad_output):
    seen["grad_input"], seen["grad_output"] = grad_input[0], grad_output[0]


handle = layer.register_full_backward_hook(record)
layer(xb).pow(2).sum().backward()
handle.remove()
print("grad_output:", tuple(seen["grad_output"].shape), "| grad_input:", tuple(seen["grad_input"].shape))
assert torch.allclose(seen["grad_input"], seen["grad_output"] @ layer.weight.detach())
assert torch.allclose(xb.grad, seen["grad_input"])

xb.grad = None
handle = layer.register_full_backward_hook(lambda mod, gin, gout: (torch.zeros_like(gin[0]),))
layer(xb).pow(2).sum().backward()
handle.remove()
print("input gradient after a hook zeroed it:", float(xb.grad.abs().sum()))
assert torch.count_nonzero(xb.grad) == 0

# %% [markdown]
# **The old `register_backward_hook` is wrong for modules made of several operations.** Older code still uses it. It
# hangs the hook on the `grad_fn` of the module's *output*, i.e. on the **last operation** inside `forward` only. For
# a module computing `linear(x).relu()`, its "grad_input" is the gradient entering the ReLU (shape 3×2), not the
# gradient of the module's input (3×4). PyTorch now emits a `FutureWarning` when that happens (asserted below) and
# says to use `register_full_backward_hook`, which gets it right.


# %%
class LinearReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x).relu()  # two autograd nodes: AddmmBackward0, then ReluBackward0


shapes = {}
new, old = LinearReLU().to(device), LinearReLU().to(device)
new.register_full_backward_hook(lambda mod, gin, gout: shapes.__setitem__("full hook", tuple(gin[0].shape)))
old.register_backward_hook(lambda mod, gin, gout: shapes.__setitem__("old hook", tuple(gin[0].shape)))
xb = torch.randn(3, 4, device=device, requires_grad=True)
new(xb).sum().backward()
out = show_warning(lambda: old(xb), FutureWarning, "non-full backward hook")
out.sum().backward()
print("input shape:", tuple(xb.shape), "| grad_input shapes seen:", shapes)
assert shapes == {"full hook": (3, 4), "old hook": (3, 2)}

# %% [markdown]
# Backward hooks have a global version too: `register_module_full_backward_hook(hook)` fires for every module of the
# program, in the order the backward pass reaches them, from the last layer to the first; a container such as
# `nn.Sequential` comes last, when the gradient of its own input is ready. (The old global
# `register_module_backward_hook` has the same flaw as `register_backward_hook`.)

# %%
seed_everything(0)
net = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)).to(device)
xb = torch.randn(4, 2, device=device, requires_grad=True)
reached = []
handle = register_module_full_backward_hook(lambda mod, gin, gout: reached.append(type(mod).__name__))
try:
    net(xb).sum().backward()
finally:
    handle.remove()
print("backward reached:", reached)
assert reached == ["Linear", "Tanh", "Linear", "Sequential"]

# %% [markdown]
# ### 9.4 Full backward hooks and in-place layers
#
# Section 8 recommended in-place ReLUs where backward allows them, and this section recommends full backward hooks.
# Together they fail. To call the hook with the gradients of a module's inputs and outputs, `__call__` passes them
# through an identity Function, `BackwardHookFunction`, which returns each tensor as it is, that is, as a *view*
# created inside a custom Function. Autograd forbids writing into such a view in place. In plain words: an in-place
# operation on a view normally rewrites the view's `grad_fn` so that backward replays the view and the operation;
# here the view's `grad_fn` is the hook's Function, so the rewrite would drop it, and the hook would no longer receive
# the right gradients. Autograd raises instead of computing wrong gradients. So an in-place layer that writes into the **input or output of a module with a full
# backward hook** raises, already in the **forward** pass: below, `ReLU(inplace=True)` right after the hooked linear
# layer. The same happens in exercise 3's setting if the model has in-place ReLUs, and with a *global* full backward
# hook every module is wrapped, so every in-place ReLU fails.

# %%
seed_everything(0)
hooked, head = nn.Linear(3, 5).to(device), nn.Linear(5, 1).to(device)
with_inplace = nn.Sequential(hooked, nn.ReLU(inplace=True), head)
xb = torch.randn(4, 3, device=device, requires_grad=True)
grads = {}
handle = hooked.register_full_backward_hook(lambda mod, gin, gout: grads.__setitem__("full hook", gout[0].clone()))
err = expect_error(lambda: with_inplace(xb))  # fails in the forward pass, at the in-place ReLU
assert str(err).startswith("Output 0 of BackwardHookFunction") and "is a view and is being modified inplace" in str(err)

without_inplace = nn.Sequential(hooked, nn.ReLU(), head)  # fix 1: the same layers, ReLU not in place
without_inplace(xb).sum().backward()
handle.remove()
print("fix 1, ReLU(inplace=False): the full hook saw grad_output of shape", tuple(grads["full hook"].shape))

# %% [markdown]
# The second fix keeps the in-place ReLU and drops the full backward hook. What the full hook's `grad_output` holds
# is the gradient with respect to the layer's output, so a **forward hook** that registers a **tensor hook** on that
# output gets the same gradient, and wraps nothing. A tensor hook registered before an in-place write sees the
# gradient with respect to the value before the write: here, the layer's output before the ReLU overwrote it, the
# same tensor the full hook saw (asserted). Write the forward hook as a `def` that returns nothing: a `lambda` would
# return the handle that `register_hook` returns, and a forward hook that returns something replaces the module's
# output (section 9.1), so the next layer would receive a handle instead of a tensor.


# %%
def hook_the_output(module, args, output):
    output.register_hook(lambda grad: grads.__setitem__("tensor hook", grad.clone()))


handle = hooked.register_forward_hook(hook_the_output)
with_inplace(xb).sum().backward()  # in-place ReLU and a working gradient hook
handle.remove()
print("fix 2, a tensor hook on the output: grad_output of shape", tuple(grads["tensor hook"].shape))
assert torch.equal(grads["tensor hook"], grads["full hook"])

# %% [markdown]
# ## 10. Practical uses of hooks
#
# **Printing shapes layer by layer.** One forward hook on every leaf module prints what goes in and out: the
# quickest way to find where a shape goes wrong in a model you did not write. The hooks are removed afterwards.
# `model.named_modules()` yields every module of a model with its name (the model itself first, named `""`), and
# `module.children()` a module's direct submodules, so a module without children is a leaf (notebook 10 teaches
# both).
#
# The model is a small **convolutional network** (卷积神经网络) for 28×28 grey images, which notebook 04 teaches and
# trains. Here you need only what each layer computes: `nn.Conv2d(1, 8, 3, padding=1)` slides 8 learned 3×3 filters
# over the image and outputs one **feature map** (特征图) per filter, each pixel a weighted sum of the 3×3
# neighbourhood around it (the padding keeps the size); `nn.MaxPool2d(2)` keeps the largest value of each 2×2 block,
# halving height and width; `nn.Flatten()` turns each image's maps into one vector for the final `nn.Linear`.

# %%
seed_everything(0)
cnn = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear(16 * 7 * 7, 10),
).to(device)


def shape_printer(name):
    def hook(module, args, output):
        print(f"{name} {type(module).__name__:10s} {tuple(args[0].shape)!s:18} -> {tuple(output.shape)}")

    return hook


handles = [
    module.register_forward_hook(shape_printer(name))
    for name, module in cnn.named_modules()
    if len(list(module.children())) == 0  # leaf modules only (not the Sequential itself)
]
images = torch.zeros(4, 1, 28, 28, device=device)
images[:, :, 6:22, 12:16] = 1.0  # a vertical bar
images[:, :, 12:16, 6:22] = 1.0  # and a horizontal one: a plus sign
logits = cnn(images)
for h in handles:
    h.remove()
assert logits.shape == (4, 10) and len(handles) == 8

# %% [markdown]
# **Capturing activations.** A forward hook can store a layer's output for later inspection (feature maps,
# dead-ReLU statistics, features for another model). Store `output.detach()`: during a forward pass that records
# a graph, the output carries a `grad_fn`, and keeping it would keep the whole graph behind it alive. Below we
# capture both ReLUs, count how many units are exactly zero, and look at the eight feature maps of the first one
# for our plus-sign image.

# %%
activations, carried = {}, {}


def save_activation(name):
    def hook(module, args, output):
        carried[name] = type(output.grad_fn).__name__  # what storing `output` itself would keep alive
        activations[name] = output.detach()

    return hook


handles = [cnn[i].register_forward_hook(save_activation(name)) for i, name in ((1, "relu1"), (4, "relu2"))]
cnn(images)
for h in handles:
    h.remove()
for name, act in activations.items():
    print(
        f"{name}: output carried {carried[name]}; stored shape {tuple(act.shape)}, "
        f"fraction of zeros {(act == 0).float().mean().item():.3f}"
    )
assert activations["relu1"].shape == (4, 8, 28, 28) and activations["relu2"].shape == (4, 16, 14, 14)
assert not activations["relu1"].requires_grad and (activations["relu1"] >= 0).all()

plot_image_grid(activations["relu1"][0].unsqueeze(1), titles=[f"channel {c}" for c in range(8)], ncols=8)
plt.show()

# %% [markdown]
# **Gradient-norm monitoring.** A tensor hook on each parameter sees that parameter's gradient on every backward
# pass, so it can log gradient norms per layer while training with no change to the training loop: this is how
# tools that watch for vanishing or exploding gradients work. We train a small MLP (like the one of section 8.2) on
# a regression task twice, with notebook 02's SGD optimizer: once with a reasonable learning rate (0.1), once with
# one too large (0.5), and let the hooks log. Each step also checks that the hooks' norms give the same total norm
# that `torch.nn.utils.get_total_norm` computes from the `.grad`s: the norm of all gradients taken as one long
# vector, the number that `torch.nn.utils.clip_grad_norm_` clips against when it rescales gradients that grew too
# large.


# %%
def train_with_grad_monitor(lr, steps=20):
    """Train a fresh MLP with SGD while parameter hooks log every gradient norm.

    Returns (gradient norms per parameter, total gradient norm per step, loss per step).
    """
    seed_everything(0)
    mlp = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    xs = torch.rand(64, 2, device=device) * 2 - 1
    ys = (xs[:, :1] * xs[:, 1:]) * 3  # a product of the inputs: the hidden layer is needed
    norms = {name: [] for name, _ in mlp.named_parameters()}
    handles = [
        p.register_hook(lambda grad, name=name: norms[name].append(grad.norm().item()))
        for name, p in mlp.named_parameters()
    ]
    optimizer = torch.optim.SGD(mlp.parameters(), lr=lr)
    totals, losses = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(mlp(xs), ys)
        loss.backward()  # the hooks fire in here
        totals.append(sum(n[-1] ** 2 for n in norms.values()) ** 0.5)
        expected = torch.nn.utils.get_total_norm([p.grad for p in mlp.parameters()]).item()
        assert abs(totals[-1] - expected) <= 1e-4 * expected
        optimizer.step()
        losses.append(loss.item())
    for h in handles:
        h.remove()
    return norms, totals, losses


runs = {lr: train_with_grad_monitor(lr) for lr in (0.1, 0.5)}


def rounded(v):
    """Two decimals for moderate numbers, the order of magnitude for exploded ones (stable across machines)."""
    return f"{v:.2f}" if v < 10 else f"{v:.0e}"


for lr, (norms, totals, losses) in runs.items():
    assert all(len(v) == 20 for v in norms.values())
    print(
        f"lr={lr}: logged {len(totals)} steps x {len(norms)} parameters | loss {rounded(losses[0])} -> "
        f"{rounded(losses[-1])} | largest total gradient norm {rounded(max(totals))}"
    )
assert runs[0.1][2][-1] < runs[0.1][2][0] and max(runs[0.1][1]) < 1.0  # stable
assert runs[0.5][1][-1] > 1e6  # exploding gradients, caught by the hooks
plot_curves(
    {f"lr={lr}": totals for lr, (_, totals, _) in runs.items()},
    xlabel="step",
    ylabel="total gradient norm",
    title="Gradient norms logged by parameter hooks",
    logy=True,
)
plt.show()

# %% [markdown]
# ## 11. The model graph in TensorBoard
#
# **TensorBoard** is a viewer for training logs: a `SummaryWriter` writes *event files* into a folder, and the
# TensorBoard server shows them in the browser (notebook 04 logs training curves with it). `SummaryWriter.add_graph`
# logs a model's **forward** graph: it runs the model once under `torch.jit.trace` and records which operations ran,
# in which modules. `torch.jit.trace` is deprecated in PyTorch 2.14 in favour of `torch.compile`/`torch.export`, so
# `add_graph` emits `FutureWarning`s; the cell prints the first one (and asserts it) rather than hiding it. This is
# not the autograd graph of `grad_fn` nodes, which exists only after a forward pass with gradients and is drawn in
# section 12.
#
# We write into `runs/03_dynamic_graphs_and_hooks/graph` and read the event file back with TensorBoard's own reader
# (and the course's `read_events`, a short wrapper around it) to prove it holds a graph. The model is a module
# written by hand: `nn.Parameter(tensor)` wraps a tensor as a learnable parameter of the module, one that requires
# grad and that `model.parameters()` lists (notebook 10 teaches it).

# %%
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from utils.tb import read_events


class Net(nn.Module):
    def __init__(self):
        super().__init__()  # older code writes super(Net, self).__init__(), the Python 2 spelling
        self.w = nn.Parameter(torch.randn(2, 1))
        self.b = nn.Parameter(torch.zeros(1, 1))

    def forward(self, x):
        return x @ self.w + self.b


seed_everything(0)
net = Net().to(device)
graph_dir = RUN_DIR / "graph"
shutil.rmtree(graph_dir, ignore_errors=True)  # one event file per run
writer = SummaryWriter(str(graph_dir))
show_warning(lambda: writer.add_graph(net, input_to_model=torch.rand(10, 2, device=device)), FutureWarning, "jit.trace")
writer.close()

summary = read_events(graph_dir)
print("event file written to", relpath(graph_dir), "with a graph of", summary.graph_nodes, "nodes")
assert summary.graph_nodes > 0
acc = EventAccumulator(str(graph_dir))
acc.Reload()
ops = sorted({node.op for node in acc.Graph().node})
print("operations in the graph:", ops)
assert {"aten::matmul", "aten::add"} <= set(ops)

# %% [markdown]
# To look at it, run these two lines in a notebook cell in JupyterLab (they start a TensorBoard server, so this
# notebook does not run them during its tests); the graph is under the **Graphs** tab:
#
# ```python
# %load_ext tensorboard
# %tensorboard --logdir ../runs/03_dynamic_graphs_and_hooks
# ```
#
# (`from tensorboard import notebook; notebook.start("--logdir ...")` does the same from Python; from a terminal,
# `tensorboard --logdir runs/03_dynamic_graphs_and_hooks`.)

# %% [markdown]
# ## 12. A picture of the `grad_fn` graph
#
# Finally we draw the backward graph itself, from a two-layer MLP's loss: walk `next_functions` from
# `loss.grad_fn`, place each node one row below the deepest node that points to it, and draw an arrow along
# each edge, in the direction gradients flow. `AccumulateGrad` boxes are labelled with the parameter they fill.
# Things to notice: `AddmmBackward0` is the fused `x @ W.T + b` of `nn.Linear`, `TBackward0` the transpose of
# `W`, and the two `None` inputs in the printout are the data `xb` and the target `yb`, which need no gradient (the
# figure leaves them out: it draws only nodes).


# %%
def backward_graph(root):
    """Nodes below root in topological order (every node before the nodes it points to) and the edges."""
    order, edges, seen = [], [], set()

    def visit(fn):
        if id(fn) in seen:
            return
        seen.add(id(fn))
        for child, _ in fn.next_functions:
            if child is not None:
                edges.append((fn, child))
                visit(child)
        order.append(fn)

    visit(root)
    return order[::-1], edges


seed_everything(0)
mlp2 = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to(device)
xb, yb = torch.randn(5, 3, device=device), torch.randn(5, 1, device=device)
loss = F.mse_loss(mlp2(xb), yb)
param_names = {id(p): name for name, p in mlp2.named_parameters()}

nodes, edges = backward_graph(loss.grad_fn)
row = {id(loss.grad_fn): 0}
for fn in nodes:  # topological order: a node's row is final before its children are placed
    for child, _ in fn.next_functions:
        if child is not None:
            row[id(child)] = max(row.get(id(child), 0), row[id(fn)] + 1)
print_chain(loss.grad_fn, names=param_names)

labels = {id(fn): node_label(fn, param_names) for fn in nodes}
node_types = {type(fn).__name__ for fn in nodes}
assert node_types == {"MseLossBackward0", "AddmmBackward0", "ReluBackward0", "TBackward0", "AccumulateGrad"}
assert sorted(labels[id(fn)] for fn in nodes if hasattr(fn, "variable")) == [
    "AccumulateGrad(0.bias)",
    "AccumulateGrad(0.weight)",
    "AccumulateGrad(2.bias)",
    "AccumulateGrad(2.weight)",
]
assert len(nodes) == 10 and len(edges) == 9 and max(row.values()) == 5

fig, ax = plt.subplots(figsize=(9, 5.5))
pos = {}
n_rows = max(row.values()) + 1
for r in range(n_rows):
    in_row = [fn for fn in nodes if row[id(fn)] == r]
    for i, fn in enumerate(in_row):
        pos[id(fn)] = ((i + 1) / (len(in_row) + 1), 1 - (r + 0.5) / n_rows)  # row 0 (the loss) on top
for parent, child in edges:
    ax.annotate(
        "",
        xy=pos[id(child)],
        xytext=pos[id(parent)],
        arrowprops=dict(arrowstyle="-|>", color="gray", shrinkA=14, shrinkB=14),
    )
for fn in nodes:
    leaf = hasattr(fn, "variable")
    ax.text(
        *pos[id(fn)],
        labels[id(fn)],
        ha="center",
        va="center",
        fontsize=8,
        bbox=dict(boxstyle="round", facecolor="#cde8c9" if leaf else "#dbe5f4", edgecolor="gray"),
    )
ax.set_title("Backward graph of F.mse_loss(mlp(x), y), walked from loss.grad_fn")
ax.set(xlim=(0, 1), ylim=(0, 1))
ax.axis("off")
plt.show()

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict which tensors keep a gradient, write a tensor hook, then a stretch that
# combines module hooks with notebook 02's linear backward and notebook 01's broadcasting. Each has a **stub cell**
# that starts with `# ✏️ Exercise N`: edit it and run it. The **check cell** below it then says *correct*, or *not
# yet* with a hint and the section to re-read, or *not attempted yet* while the stub is untouched. This section does
# not depend on the lesson's cells: after a kernel restart, run its first cell and go on. `make progress` (without
# make, e.g. on Windows: `python tools/course.py progress`) lists which exercises of every notebook pass.

# %%
import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("03")

# %% [markdown]
# ### Exercise 1 · Which tensors are leaves, which keep a `.grad`?
#
# Two questions every learner of autograd meets: what is a leaf tensor (什么是叶子节点张量呢？), and why are
# `loss.grad`, `y1.grad` and `y2.grad` `None` after `backward()` (这是为什么呢？). Answer them for this code, on paper
# first (sections 4 and 6):
#
# ```python
# w = torch.tensor([1.0, 2.0], requires_grad=True)
# c = torch.tensor([3.0, 4.0])
# d = torch.ones(2, requires_grad=True).double()
# y = w * c
# y.retain_grad()
# z = y.sum() + d.sum()
# u = w.detach()
# with torch.no_grad():
#     n = w * 2
# z.backward()
# ```
#
# Which of `w, c, d, y, z, u, n` are leaves (`is_leaf`)? Which have a `.grad` that is not `None` after
# `z.backward()`? (Running the code afterwards to see why is allowed; running it instead of thinking teaches less.)

# %%
# ✏️ Exercise 1: replace ... with (set of the leaves, set of the tensors with a .grad), e.g. ({"w", "c"}, {"w"})
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · Scale a gradient with a tensor hook
#
# Write `scale_grad(t, alpha)`: it returns a tensor equal to `t`, such that the gradient flowing back **through
# it** is multiplied by `alpha`, while other uses of `t` are untouched. (With a negative `alpha` it is the
# gradient reversal layer that notebook 02 wrote as the custom `Function` `GradCoeff`; here use a hook, section 5,
# and let the hook do the scaling: the check makes sure of it, so a `Function` or a `detach` trick does not count,
# with or without a hook beside it.) Think about which tensor the hook must hang on, and what the hook must return. When `t` does not require grad there is nothing to scale: return it
# unchanged.


# %%
# ✏️ Exercise 2: write the body of the function
def scale_grad(t: torch.Tensor, alpha: float) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(2, scale_grad)

# %% [markdown]
# ### Exercise 3 · Per-sample gradients with module hooks (stretch)
#
# Differentially private training (DP-SGD) and some data-cleaning tools need the gradient of every *sample*, not
# only the batch's sum. For an `nn.Linear` layer hooks give them cheaply. The layer computes
# `out = inp @ weight.T + bias`, so (as in notebook 02's `LinearFunction`)
# `weight.grad = grad_out.T @ inp` $= \sum_i$ `outer(grad_out[i], inp[i])`: sample `i` contributes
# `outer(grad_out[i], inp[i])`, a matrix shaped like `weight`, where `inp` is what entered the layer and
# `grad_out` the gradient of the loss with respect to the layer's output.
#
# Write `per_sample_grads(model, layer, x, loss_fn)`: `layer` is an `nn.Linear` somewhere inside `model`. Register
# a forward hook that keeps the layer's input and a full backward hook that keeps `grad_output` (section 9), run
# `loss_fn(model(x)).backward()`, remove the hooks, and return the contributions of the `N` samples of `x`, shape
# `(N, out_features, in_features)`, computed without a loop by broadcasting (notebook 01). They add up
# to `layer.weight.grad`.


# %%
# ✏️ Exercise 3: write the body of the function
def per_sample_grads(model: nn.Module, layer: nn.Linear, x: torch.Tensor, loss_fn) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(3, per_sample_grads)

# %% [markdown]
# ## Summary
#
# - The forward pass runs eagerly and records a graph on the fly, a new one on every call; Python `if`/`while`
#   decide what is recorded. Static-graph frameworks built the graph once and optimised it as a whole;
#   `torch.compile` brings that to eager PyTorch code.
# - The recorded graph is made of backward nodes, not tensors: each result's `grad_fn` links to its inputs' nodes
#   through `next_functions`, down to one `AccumulateGrad` per leaf (its `.variable` is the leaf). The three-weight
#   example gives gradients 28, 8 and 10.
# - Gradients reaching a tensor along several paths are summed in the engine's input buffer; its hooks and
#   `AccumulateGrad` run once with the sum. `.grad` accumulates across `backward()` calls.
# - `backward()` and `torch.autograd.grad` free the saved tensors; a second pass needs `retain_graph=True`, and
#   gradients add up in `.grad` until you zero them. `saved_tensors_hooks(pack, unpack)` shows, or replaces, what is
#   saved.
# - Only leaves that require grad keep `.grad`; `retain_grad()` keeps an intermediate one; `.double()`/`.to()` after
#   creation makes a non-leaf.
# - `detach()` shares storage (not shape changes), `no_grad` records nothing, `inference_mode` makes tensors that no
#   backward may save (`t + p` works, `t * p` is refused when recorded), `eval()` stops nothing; avoid `.data`, its
#   changes are invisible to autograd.
# - `y.backward(v)` (or `torch.autograd.backward(y, grad_tensors=v)`; `grad_variables` is the deprecated 0.x name)
#   computes $v^\top J$, which lets a backward pass be split at `y.detach().requires_grad_()`.
# - In-place writes are checked with version counters: refused on leaves that require grad and on saved values.
#   `torch.autograd.detect_anomaly()` names the forward line behind a failing backward node and stops at the first
#   NaN gradient, at a large cost: for debugging only.
# - `nn.Module.__call__` runs global and module pre-hooks, `forward`, then forward hooks; `model.forward(x)` skips
#   them, and a function such as `F.relu` has no hooks at all. A module called twice fires its hooks twice and sums
#   its parameters' gradients. Use `register_full_backward_hook` (not the old `register_backward_hook`), but not on a
#   module whose input or output an in-place layer overwrites: use a tensor hook on the output there.
# - Hooks print shapes, capture activations and monitor gradient norms without touching the model's code.
# - `SummaryWriter.add_graph` logs the traced forward graph (through the deprecated `torch.jit.trace`); the autograd
#   graph itself can be walked and drawn from `grad_fn`.
#
# **Which hook for what.** Every hook returns a handle: call `handle.remove()` when you are done.
#
# | you want to … | register | the hook is called as | and fires |
# |---|---|---|---|
# | see or change the gradient with respect to a tensor | `t.register_hook(fn)` | `fn(grad)`, returns a new gradient or `None` | when that gradient is computed (for a leaf, before `.grad` is updated) |
# | act on a parameter's accumulated `.grad` | `p.register_post_accumulate_grad_hook(fn)` | `fn(param)` | after `AccumulateGrad` updated `param.grad` |
# | see the gradients entering a graph node | `node.register_prehook(fn)` | `fn(grad_outputs)` | before the node runs, with the summed gradient |
# | see or replace a module's inputs | `m.register_forward_pre_hook(fn)` | `fn(module, args)`, returns new args or `None` | before `forward` |
# | see or replace a module's output | `m.register_forward_hook(fn)` | `fn(module, args, output)`, returns a new output or `None` | after `forward` |
# | see the gradients of a module's outputs | `m.register_full_backward_pre_hook(fn)` | `fn(module, grad_output)` | during backward, before the input gradients |
# | see or replace the gradients of a module's inputs | `m.register_full_backward_hook(fn)` | `fn(module, grad_input, grad_output)`, returns a new `grad_input` or `None` | during backward; no in-place writes into that module's inputs or outputs |
# | the same for every module | `register_module_forward_pre_hook`, `register_module_forward_hook`, `register_module_full_backward_hook` (in `torch.nn.modules.module`) | as above | for every module of the program |
# | see or replace what autograd saves | `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):` | `pack(tensor)` returns what is kept, `unpack(kept)` returns the tensor | when an operation saves a tensor; when backward needs it |

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson was built from a teacher's study notes, written in Chinese for PyTorch 1.x. If you have them, this table
# lists what they say that no longer holds, or never quite held, and where the lesson shows today's behaviour.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | The graph's nodes are tensors or `Function`s, its edges the dependencies between them (动态计算图 §1). | The nodes are backward nodes (`grad_fn`, one `AccumulateGrad` per leaf); tensors hang off the graph: a result points to its node, a node keeps the tensors it saved. | §1 · The forward pass runs eagerly; §2 · `grad_fn` chains and `next_functions` |
# | `print(loss.data)`; `print_tensor` prints `t.data`. | `.data` is a legacy back door whose in-place edits autograd cannot see; print with `.item()` or `.detach()`. | §1; §6 · `requires_grad` propagation, `detach`, `no_grad` and `inference_mode` |
# | `x.grad` adds up the several gradients it receives, and this is the chain rule's sum (计算图与反向传播, step 3). | The engine sums the contributions of all paths in the node's input buffer and runs `AccumulateGrad` once, with the total; adding into `.grad` is accumulation *across* `backward()` calls. | §2 |
# | `print_tensor` prints `t.grad` and `t.grad_fn` of every tensor, e.g. `<MulBackward0 object at 0x7fd7f99aa668>`. | Reading `.grad` of a non-leaf returns `None` with a `UserWarning`; the repr's address changes on every run, so print `type(t.grad_fn).__name__`. | §2; §4 · Leaf and non-leaf tensors |
# | The graph is destroyed right after `backward()`. | The saved tensors are freed, and the next forward pass records a new graph; nodes that saved nothing (additions, sums) can even be back-propagated twice. | §3 · The graph is freed after `backward` |
# | A leaf tensor must have `requires_grad=True`. | Every tensor with `requires_grad=False` is a leaf too; `requires_grad=True` is the condition for a leaf to receive a `.grad`. | §4 |
# | The quoted `detach` docs: in-place size, stride or storage changes (`resize_`, `set_`, `transpose_`) of the detached tensor raise an error. | They raise nothing, and change only the detached tensor's shape; its numbers stay shared (today's docs no longer carry that note). | §6 |
# | `backward()`'s second argument is `grad_variables`. | `grad_tensors` since PyTorch 0.4 (or `y.backward(gradient=v)`); `grad_variables` still works, with a `FutureWarning`. | §7 · `backward(gradient)` and splitting a backward pass in two |
# | Split a backward pass with `y1 = y.clone().detach().requires_grad_(True)`. | Right, but the clone copies for nothing: `y.detach().requires_grad_()` gives the same gradients. | §7 |
# | Make every ReLU in place (`model.apply(inplace_relu)`) to save memory. | Safe only when backward does not need the overwritten value (not after a sigmoid), and never on the input or output of a module with a full backward hook: that raises in the forward pass. | §8 · In-place operations that break autograd; §9.4 · Full backward hooks and in-place layers |
# | `register_backward_hook` and the global `register_module_backward_hook` (PyTorch 1.6 source). | They see only the last operation of a module's `forward`, and warn (`FutureWarning`); use `register_full_backward_hook` and `register_module_full_backward_hook`. | §9.3 · Backward hooks |
# | The global `register_module_forward_pre_hook` example registers its hook and never removes it. | A global hook fires for every module of the program until removed: keep the handle and call `handle.remove()`. | §9.1 · Forward hooks, on one module and on all of them |
# | Static graphs are more efficient in theory (built once, Conv and ReLU fused), and PyTorch is no slower than Caffe or TensorFlow (a benchmark of that time). | Speed depends mostly on the kernels, not on the kind of graph; `torch.compile` now captures graphs from eager code and fuses operations (notebook 11). | §1 |
# | `SummaryWriter.add_graph(net, ...)`, with `super(Net, self).__init__()`. | `add_graph` traces with the deprecated `torch.jit.trace` and warns (`FutureWarning`); `super().__init__()` is the Python 3 spelling. | §11 · The model graph in TensorBoard |
