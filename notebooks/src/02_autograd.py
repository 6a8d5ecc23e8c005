# %% [markdown]
# # 02 · Autograd and custom Functions (自动微分)
#
# Training a model means following derivatives: how much does the error change when each parameter moves a little?
# PyTorch computes those derivatives for you. This notebook first fits one small model five times, replacing
# hand-written code by PyTorch one piece at a time, then opens each piece: what `backward()` computes, where the
# gradients add up, how to write your own differentiable operations and check them.
#
# **You will learn to:**
# 1. fit a model by hand in NumPy, then with tensors, **autograd** (自动微分), `nn` layers and an `optim`
#    optimizer, and see that every PyTorch tool replaces code, not mathematics;
# 2. compute derivatives with `backward()` and `torch.autograd.grad`, second derivatives included, and say what
#    `backward(gradient=g)` computes on a non-scalar (a vector–Jacobian product) and what forward mode computes
#    (a Jacobian–vector product), and when each is cheaper;
# 3. predict how gradients add up: along the paths of one backward pass, and across passes in `.grad`; reset them, or
#    accumulate on purpose;
# 4. minimise a function with an optimizer, and predict from a closed form what the learning rate does;
# 5. write custom `torch.autograd.Function`s, check them with `gradcheck` and `gradgradcheck`, make them work with
#    `torch.func` (`vmap`, `jacrev`, `jvp`, `jacfwd`), and avoid the two traps of double backward;
# 6. use the arguments of `backward` and `autograd.grad` (`create_graph`, `retain_graph`, `inputs`,
#    `allow_unused`) to train with a gradient penalty, and freeze part of a model.
#
# **Before this notebook.** Notebook 01: creating tensors, shapes, dtypes, broadcasting and matrix products. Calculus
# at the level of the chain rule and partial derivatives.
#
# **Study time:** about 170 min for a first-time learner, 30 of them for the exercises (which build on sections 3, 4,
# 6 and 7). The parts marked *(deeper)* can wait for a second reading. The slowest cells are the numerical gradient
# check of the convolution and the three short training runs with a gradient penalty (1–2 s each).
#
# **On a GPU.** Nothing changes in what you learn: the optimizer, the convolution check, the gradient-penalty model
# and the frozen ResNet run on `device`, which is CUDA when one is present. Everything here is tiny, so the GPU is not
# faster; the stored outputs were made on the CPU.
#
# The course grew out of a teacher's study notes written for PyTorch 1.x. Where the notes differ from PyTorch 2.14,
# the last section, after the summary, lists what changed and where this notebook shows it.

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
# `seed_everything(0)` makes the random numbers repeatable; `get_device()` picks CUDA, then Apple MPS, then the CPU
# (the stored outputs use the CPU). Two helpers of the course: `fmt(t, d)` formats a tensor with `d` decimals for
# printing, and `plot_curves` draws one line per named list of numbers.

# %%
import inspect
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from utils import fmt, get_device, plot_curves, seed_everything, show_warning

seed_everything(0)
device = get_device()
print("device:", device.type)

# %% [markdown]
# ## 1. From NumPy to `nn` and `optim`: one model, five times
#
# The task: learn a function from examples. A **model** (模型) turns an input $x$ into a prediction $\hat y$ through
# **parameters** (参数), numbers that training adjusts. Ours is a network with two layers:
#
# $$\hat y = \mathrm{ReLU}(x W_1)\, W_2, \qquad \mathrm{ReLU}(h) = \max(h, 0) \text{ element by element.}$$
#
# ReLU is the **activation function** (激活函数): without it the two matrix products would collapse into one. The
# input $x$ is a **batch** (批次) of $N = 64$ examples with 100 numbers each, one per row, so $xW_1$ handles all 64 in
# one matrix product. $W_1$ is $100\times 32$ and $W_2$ is $32\times 10$: 10 outputs per example, 3,520 parameters.
#
# The **loss function** (损失函数) says how wrong the predictions are; here the sum of squared errors over the
# $64\times 10$ entries, $L = \sum (\hat y - y)^2$. Training is **gradient descent** (梯度下降): repeat
# $W \leftarrow W - \eta\, \partial L/\partial W$ for every parameter matrix, a small step against the **gradient**
# (梯度) $\partial L/\partial W$, whose size is set by the **learning rate** (学习率) $\eta$. The data are random
# numbers: the point is the mechanics (the loss still falls, since 3,520 parameters can partly fit 640 targets).
#
# We write the training loop five times, as PyTorch's classic tutorial "Learning PyTorch with Examples" does. Each
# version replaces one piece of hand-written code by PyTorch and changes nothing else: same data, same starting
# weights, same learning rate, float64 everywhere. So the five loss curves must be one curve, up to the order in
# which NumPy and PyTorch sum inside their matrix products.

# %%
N, D_in, H, D_out, STEPS, LR = 64, 100, 32, 10, 50, 1e-3
rng = np.random.default_rng(0)  # NumPy's seeded random generator
x_np, y_np = rng.standard_normal((N, D_in)), rng.standard_normal((N, D_out))
w1_init, w2_init = rng.standard_normal((D_in, H)) / 10, rng.standard_normal((H, D_out)) / 10
curves = {}  # name -> the loss at every step
print("x", x_np.shape, "| y", y_np.shape, "| W1", w1_init.shape, "| W2", w2_init.shape)
print("parameters:", w1_init.size + w2_init.size)

# %% [markdown]
# ### 1.1 NumPy: backpropagation by hand
#
# The gradients come from the **chain rule** (链式法则), applied from the loss backwards through each step of the
# computation: this is **backpropagation** (反向传播). For a matrix product $Y = AB$ and any loss $L$, with
# $G = \partial L/\partial Y$: $\partial L/\partial A = G B^\top$ and $\partial L/\partial B = A^\top G$ (each
# gradient has the shape of its matrix, which is a good way to remember where the transposes go). Step by step:
#
# | forward step | backward step |
# |---|---|
# | $L = \sum(\hat y - y)^2$ | $\partial L/\partial \hat y = 2(\hat y - y)$ |
# | $\hat y = h_\mathrm{relu} W_2$ | $\partial L/\partial W_2 = h_\mathrm{relu}^\top\, \partial L/\partial \hat y$, and $\partial L/\partial h_\mathrm{relu} = \partial L/\partial \hat y\; W_2^\top$ |
# | $h_\mathrm{relu} = \max(h, 0)$ | $\partial L/\partial h$ = $\partial L/\partial h_\mathrm{relu}$ where $h > 0$, and 0 elsewhere |
# | $h = x W_1$ | $\partial L/\partial W_1 = x^\top\, \partial L/\partial h$ |

# %%
w1, w2 = w1_init.copy(), w2_init.copy()
curves["1 NumPy"] = []
for _ in range(STEPS):
    h = x_np @ w1  # forward pass
    h_relu = np.maximum(h, 0)
    y_pred = h_relu @ w2
    curves["1 NumPy"].append(float(np.square(y_pred - y_np).sum()))
    grad_y_pred = 2.0 * (y_pred - y_np)  # backward pass, by hand
    grad_w2 = h_relu.T @ grad_y_pred
    grad_h = grad_y_pred @ w2.T
    grad_h[h <= 0] = 0  # ReLU passes the gradient only where its input was positive
    grad_w1 = x_np.T @ grad_h
    w1 -= LR * grad_w1  # gradient descent
    w2 -= LR * grad_w2
print("loss every 10 steps:", [round(v, 2) for v in curves["1 NumPy"][::10]], "...", round(curves["1 NumPy"][-1], 2))
assert curves["1 NumPy"][-1] < curves["1 NumPy"][0] / 2

# %% [markdown]
# ### 1.2 Tensors: the same code in PyTorch
#
# PyTorch's tensors have NumPy's operations under similar names: `@`, `.T`, and `clamp(min=0)` for $\max(h, 0)$. The
# only gain so far is that the same code runs on a GPU once the tensors are moved there with `.to(device)`.
# `torch.from_numpy` shares the array's memory and `torch.tensor(array)` copies it (notebook 01). The cell ends by
# comparing its loss curve with NumPy's using `np.testing.assert_allclose(actual, desired, rtol=...)`, NumPy's
# assertion that two arrays agree within a relative tolerance (it raises `AssertionError`, listing the mismatches, if
# they do not); the later versions are checked the same way.

# %%
xt, yt = torch.from_numpy(x_np), torch.from_numpy(y_np)
w1, w2 = torch.tensor(w1_init), torch.tensor(w2_init)
curves["2 tensors"] = []
for _ in range(STEPS):
    h = xt @ w1
    h_relu = h.clamp(min=0)
    y_pred = h_relu @ w2
    curves["2 tensors"].append((y_pred - yt).pow(2).sum().item())
    grad_y_pred = 2.0 * (y_pred - yt)
    grad_w2 = h_relu.T @ grad_y_pred
    grad_h = grad_y_pred @ w2.T
    grad_h[h <= 0] = 0
    w1 -= LR * (xt.T @ grad_h)
    w2 -= LR * grad_w2
print("last loss, NumPy vs tensors:", round(curves["1 NumPy"][-1], 2), round(curves["2 tensors"][-1], 2))
np.testing.assert_allclose(curves["2 tensors"], curves["1 NumPy"], rtol=1e-9)

# %% [markdown]
# ### 1.3 Autograd: `loss.backward()` writes the backward pass
#
# Create the weights with `requires_grad=True` and PyTorch records every operation done with them, a
# **computational graph** (计算图) from the weights to the loss. `loss.backward()` then runs backpropagation through
# that graph and stores $\partial L/\partial W$ in the attribute `W.grad`: the five lines of hand-written gradients
# disappear. The cell checks once, before training, that `backward()` finds the hand-derived gradient (to 12 digits).
#
# Two details of the loop. The update must not be recorded (it is not part of the model), so it runs inside
# `with torch.no_grad():`. And `backward()` *adds* into `.grad` (section 4 shows why), so `.grad` is reset to `None`
# after each update. The loss is a 0-dimensional tensor, shape `torch.Size([])`; `.item()` turns it into a Python
# number.

# %%
w1 = torch.tensor(w1_init, requires_grad=True)
w2 = torch.tensor(w2_init, requires_grad=True)

loss = ((xt @ w1).clamp(min=0) @ w2 - yt).pow(2).sum()
loss.backward()  # fills w1.grad and w2.grad
h = xt @ w1.detach()
by_hand_w1 = xt.T @ ((2.0 * (h.clamp(min=0) @ w2.detach() - yt) @ w2.detach().T) * (h > 0))
print("loss:", type(loss).__name__, "of shape", loss.shape, "| w1.grad:", tuple(w1.grad.shape))
print("backward() equals the hand-derived gradient of W1:", torch.allclose(w1.grad, by_hand_w1, rtol=1e-12))
assert torch.allclose(w1.grad, by_hand_w1, rtol=1e-12) and loss.shape == torch.Size([])
w1.grad = w2.grad = None

curves["3 autograd"] = []
for _ in range(STEPS):
    loss = ((xt @ w1).clamp(min=0) @ w2 - yt).pow(2).sum()
    curves["3 autograd"].append(loss.item())
    loss.backward()
    with torch.no_grad():  # the update must not be recorded
        w1 -= LR * w1.grad
        w2 -= LR * w2.grad
        w1.grad = w2.grad = None
np.testing.assert_allclose(curves["3 autograd"], curves["1 NumPy"], rtol=1e-9)

# %% [markdown]
# ### 1.4 `nn`: layers instead of weight matrices
#
# `torch.nn` packages each piece of a model as a **layer** (层), an object that holds its own parameters:
#
# * `nn.Linear(n_in, n_out)` computes $x W^\top + b$. It stores $W$ with shape `(n_out, n_in)`, the transpose of our
#   $W_1$, and a bias $b$, switched off here with `bias=False` to match the model above;
# * `nn.ReLU()` applies ReLU; `nn.Sequential(a, b, c)` chains layers, and calling the result, `net(x)`, runs them in
#   order;
# * `nn.MSELoss(reduction="sum")` is our loss (its default, `"mean"`, would divide by the 640 entries);
# * `net.parameters()` yields every parameter tensor, created with `requires_grad=True`. It is a generator, used up
#   after one pass: wrap it in `list(...)` to go over it twice. `net.named_parameters()` gives their names too,
#   `net.zero_grad()` resets their `.grad`, and `.double()` converts them to float64.
#
# A layer is a thin object around a function of `torch.nn.functional` (imported as `F`): the cell prints the whole
# `forward` of `nn.ReLU`, read from the installed PyTorch with `inspect.getsource`, which returns the source code of a
# function or class (`inspect` is a module of Python's standard library). Notebook 10 opens `nn.Module`, the class
# every layer and model derives from.


# %%
def two_layer_net() -> nn.Sequential:
    """The same network as nn layers, starting from the same weights."""
    net = nn.Sequential(nn.Linear(D_in, H, bias=False), nn.ReLU(), nn.Linear(H, D_out, bias=False)).double()
    with torch.no_grad():  # net[0] is the first layer; copy_ overwrites its weight in place
        net[0].weight.copy_(torch.from_numpy(w1_init.T))
        net[2].weight.copy_(torch.from_numpy(w2_init.T))
    return net


net = two_layer_net()
print(net)
params_once = net.parameters()
first_pass, second_pass = list(params_once), list(params_once)
print("net.parameters() gives", len(first_pass), "tensors, then", len(second_pass), "on a second pass")
assert (len(first_pass), len(second_pass)) == (2, 0)
for name, param in net.named_parameters():
    print(f"  {name}: shape {tuple(param.shape)}, requires_grad {param.requires_grad}")
print(inspect.getsource(nn.ReLU.forward))

loss_fn = nn.MSELoss(reduction="sum")
curves["4 nn"] = []
for _ in range(STEPS):
    loss = loss_fn(net(xt), yt)
    curves["4 nn"].append(loss.item())
    net.zero_grad()
    loss.backward()
    with torch.no_grad():
        for param in net.parameters():
            param -= LR * param.grad
np.testing.assert_allclose(curves["4 nn"], curves["1 NumPy"], rtol=1e-9)

# %% [markdown]
# ### 1.5 `optim`: the update step
#
# An **optimizer** (优化器) holds the parameters it was given and updates them from their `.grad`:
# `torch.optim.SGD(net.parameters(), lr=LR)` does $p \leftarrow p - \eta\, p.\mathrm{grad}$ in `step()`, and
# `zero_grad()` resets the gradients. The three lines `zero_grad()` → `backward()` → `step()` are the heart of every
# training loop in this course.
#
# Other optimizers change only the rule inside `step()`. **Adam** divides a running average of each parameter's
# gradients by a running estimate of their size, so every parameter moves by steps of about the learning rate
# (notebook 10 compares optimizers). Switching to it is a one-line change, drawn as a sixth, dashed curve; it takes a
# different path, so it is not compared with the five.

# %%
net = two_layer_net()
optimizer = torch.optim.SGD(net.parameters(), lr=LR)
curves["5 optim"] = []
for _ in range(STEPS):
    loss = loss_fn(net(xt), yt)
    curves["5 optim"].append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

net = two_layer_net()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)  # the one line that changes
adam_curve = []
for _ in range(STEPS):
    loss = loss_fn(net(xt), yt)
    adam_curve.append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

for name, curve in curves.items():
    print(f"{name:10} loss at step 0: {curve[0]:8.2f}   at step {STEPS - 1}: {curve[-1]:8.2f}")
print(f"{'Adam':10} loss at step 0: {adam_curve[0]:8.2f}   at step {STEPS - 1}: {adam_curve[-1]:8.2f}")
reference = np.array(curves["1 NumPy"])
for curve in curves.values():
    np.testing.assert_allclose(curve, reference, rtol=1e-9)  # the same curve, five times
assert reference[-1] < reference[0] / 2 and adam_curve[-1] < reference[-1]
for name, curve in curves.items():
    plt.plot(curve, label=name, lw=4 if name.startswith("1") else 1.5)
plt.plot(adam_curve, "k--", label="Adam, lr=0.01")
plt.yscale("log")
plt.xlabel("step")
plt.ylabel("squared error")
plt.title("Five implementations, one loss curve")
plt.legend()
plt.show()

# %% [markdown]
# Everything that follows opens one of these pieces: what `backward()` computes (sections 2–4), what an optimizer
# does with it (section 5), how to add your own operations to autograd (sections 6–7), and the finer controls
# (sections 8–10).

# %% [markdown]
# ## 2. `backward()` on a scalar, and `torch.autograd.grad`
#
# Autograd records the operations done on tensors with `requires_grad=True`. A tensor you create yourself with
# `requires_grad=True` is a **leaf tensor** (叶子节点); a tensor computed from it has a `grad_fn`, the graph node that
# knows its backward formula, and is not a leaf. (Every tensor with `requires_grad=False` counts as a leaf too, so
# `torch.ones(2).is_leaf` is `True`; only leaves that require a gradient receive a `.grad`.) Calling `backward()` on a **scalar** walks the graph backwards with
# the chain rule and stores $\partial y/\partial x$ in the `.grad` of every leaf that requires a gradient.
#
# The running example of this section is $f(x) = ax^2 + bx + c$ with $a=1, b=-2, c=1$, so $f(x) = (x-1)^2$. Its
# derivative is $2ax + b$: at $x=0$ we expect $-2$.

# %%
a, b, c = torch.tensor(1.0), torch.tensor(-2.0), torch.tensor(1.0)


def f(x: torch.Tensor) -> torch.Tensor:
    """The quadratic a*x**2 + b*x + c (element-wise)."""
    return a * torch.pow(x, 2) + b * x + c


x = torch.tensor(0.0, requires_grad=True)  # a leaf: we want dy/dx
y = f(x)
print("y =", y.item(), "| y.grad_fn:", type(y.grad_fn).__name__)
print("x.is_leaf:", x.is_leaf, "| y.is_leaf:", y.is_leaf, "| x.grad before backward:", x.grad)
y.backward()
print("dy/dx at x=0:", x.grad)
assert x.grad == 2 * a * x.detach() + b

# %% [markdown]
# With two leaves, $c = p^2 + q$ at $p = 1$, $q = 2$: $\partial c/\partial p = 2p = 2$ and $\partial c/\partial q = 1$.
# `requires_grad` spreads: `c` requires a gradient because its inputs do.

# %%
p_leaf = torch.tensor(1.0, requires_grad=True)
q_leaf = torch.tensor(2.0, requires_grad=True)
c_out = p_leaf**2 + q_leaf
c_out.backward()
print("c =", c_out.item(), "| grad_fn:", type(c_out.grad_fn).__name__)
for name, t in (("p", p_leaf), ("q", q_leaf)):
    print(
        f"{name}: value {t.item()}, requires_grad {t.requires_grad}, grad {t.grad.item()}, grad_fn {t.grad_fn}, leaf {t.is_leaf}"
    )
assert (p_leaf.grad.item(), q_leaf.grad.item()) == (2.0, 1.0)

# %% [markdown]
# **`Variable` is gone.** Older code (and many old tutorials) wraps tensors in `torch.autograd.Variable(...)` to
# make them differentiable. Since PyTorch 0.4 (2018) `Tensor` and `Variable` are one class: every tensor carries
# `requires_grad`, `grad` and `grad_fn` itself. The name survives only as a shim that hands back a plain tensor, so
# write `torch.tensor(..., requires_grad=True)` or `t.requires_grad_()` instead.

# %%
from torch.autograd import Variable  # still importable, for old code

v = Variable(torch.ones(2), requires_grad=True)
print("Variable(...) returns:", type(v).__name__, "| requires_grad:", v.requires_grad, "| leaf:", v.is_leaf)
assert type(v) is torch.Tensor

t = torch.ones(2).requires_grad_()  # the modern way
assert t.requires_grad and t.is_leaf

# %% [markdown]
# ### `torch.autograd.grad`: returned gradients, second derivatives
#
# `torch.autograd.grad(outputs, inputs)` computes the same derivatives but **returns** them as a tuple instead of
# writing `.grad`. With `create_graph=True` the backward pass is itself recorded as a graph, so the returned
# derivative can be differentiated again: a **second derivative** (二阶导数). For our quadratic $f'(0) = -2$ and
# $f'' = 2a = 2$.
#
# Without `create_graph` the returned derivative is a plain constant (no `grad_fn`), and asking for its derivative
# fails. To print a value, use `.item()` for a number or `.detach()` for a tensor; older code writes `.data`, and the
# next cell shows why that is risky.

# %%
x = torch.tensor(0.0, requires_grad=True)
(dy_dx,) = torch.autograd.grad(f(x), x, create_graph=True)
print("dy/dx =", dy_dx.item(), "| dy/dx has a grad_fn:", dy_dx.grad_fn is not None)
(d2y_dx2,) = torch.autograd.grad(dy_dx, x)
print("d2y/dx2 =", d2y_dx2.item())
assert dy_dx.item() == -2.0 and d2y_dx2.item() == 2.0

(dy_dx_plain,) = torch.autograd.grad(f(x), x)  # create_graph=False (the default)
print("without create_graph, dy/dx requires_grad:", dy_dx_plain.requires_grad)
try:
    torch.autograd.grad(dy_dx_plain, x)
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")
print("x.grad after autograd.grad:", x.grad)
assert x.grad is None  # returned, never accumulated into .grad

# %% [markdown]
# The same works on a whole vector when the function is element-wise: differentiate the *sum* (each $y_i$ depends only
# on $x_i$, so the gradient of the sum holds every $dy_i/dx_i$). For $\sin$ we get $\cos$ and then $-\sin$.

# %%
xs = torch.linspace(0.0, 3.0, 5, requires_grad=True)
(d1,) = torch.autograd.grad(torch.sin(xs).sum(), xs, create_graph=True)
(d2,) = torch.autograd.grad(d1.sum(), xs)
print("x       :", fmt(xs))
print("d sin   :", fmt(d1))
print("d2 sin  :", fmt(d2))
assert torch.allclose(d1, torch.cos(xs.detach())) and torch.allclose(d2, -torch.sin(xs.detach()))

# %% [markdown]
# ### Why not `.data`?
#
# `t.data` and `t.detach()` both give a tensor that shares memory with `t` and stands outside the graph. The
# difference is autograd's safety check. Every tensor has a **version counter**, `t._version`, which each in-place
# operation (an operation ending in `_`, notebook 01) increases by one. When autograd saves a tensor for the backward
# pass it notes the version, and the backward pass raises if the version has changed since. A tensor from
# `.detach()` shares the version counter of `t`; a tensor from `.data` has a counter of its own, so edits through it
# go unnoticed.
#
# The sigmoid $\sigma(x) = 1/(1 + e^{-x})$ shows the consequence. Its derivative is $\sigma' = \sigma(1-\sigma)$,
# so its backward reuses its output. Zeroing that output through `.data` silently makes the gradient wrong, while the
# same edit through `.detach()` raises an error.

# %%
t = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
correct = torch.sigmoid(t.detach()) * (1 - torch.sigmoid(t.detach()))

out = t.sigmoid()
assert out.data.data_ptr() == out.detach().data_ptr() == out.data_ptr()  # all share memory
out.data.zero_()  # old style: the edit is invisible to autograd
print("after out.data.zero_()    : out._version =", out._version)
out.sum().backward()
print("true gradient             :", fmt(correct))
print("gradient after .data edit :", fmt(t.grad), "<- silently wrong")
assert out._version == 0 and not torch.allclose(t.grad, correct)

t.grad = None
out = t.sigmoid()
out.detach().zero_()  # same edit through .detach(): autograd notices
print("after out.detach().zero_(): out._version =", out._version)
try:
    out.sum().backward()
except RuntimeError as err:
    print("backward after .detach() edit:", type(err).__name__, "-", str(err).split(":")[0])
assert out._version == 1

# %% [markdown]
# ### Several inputs, several outputs
#
# `inputs` may be a list: you get one derivative per input. With a list of `outputs`, the derivatives of all outputs
# are **summed**, the same as differentiating `y1 + y2`. For $y_1 = x_1x_2$, $y_2 = x_1 + x_2$ at $(1, 2)$:
# $\nabla y_1 = (2, 1)$ and $\nabla(y_1+y_2) = (3, 2)$. `retain_graph=True` keeps the graph alive for the second call
# (section 4 explains why it is needed).

# %%
x1 = torch.tensor(1.0, requires_grad=True)
x2 = torch.tensor(2.0, requires_grad=True)
y1 = x1 * x2
y2 = x1 + x2

dy1_dx1, dy1_dx2 = torch.autograd.grad(outputs=y1, inputs=[x1, x2], retain_graph=True)
print("dy1/dx1, dy1/dx2:", dy1_dx1.item(), dy1_dx2.item())
d12_dx1, d12_dx2 = torch.autograd.grad(outputs=[y1, y2], inputs=[x1, x2], retain_graph=True)
print("d(y1+y2)/dx1, d(y1+y2)/dx2:", d12_dx1.item(), d12_dx2.item())
sum_dx1, sum_dx2 = torch.autograd.grad(y1 + y2, [x1, x2])
assert (dy1_dx1.item(), dy1_dx2.item()) == (2.0, 1.0)
assert (d12_dx1, d12_dx2) == (sum_dx1, sum_dx2) == (3.0, 2.0)

# %% [markdown]
# ## 3. `backward()` on a non-scalar: the `gradient` argument
#
# If the output $y$ is not a scalar, "the derivative of $y$" is a whole **Jacobian** (雅可比矩阵)
# $J_{ij} = \partial y_i / \partial x_j$, and `.grad` has no room for it: `x.grad` must have the shape of `x`. So
# `backward()` refuses a non-scalar unless you pass a `gradient` tensor $g$ of the same shape as $y$. PyTorch then
# computes the **vector–Jacobian product** (向量-雅可比积) $g^\top J$, which has the shape of $x$:
# $(g^\top J)_j = \sum_i g_i\, \partial y_i/\partial x_j$. With $g$ all ones this is the gradient of `y.sum()`.
# (Older code calls `torch.autograd.backward(y, grad_variables=g)`. That keyword is now `grad_tensors` and the old name
# warns, as notebook 03 shows; `Tensor.backward` never accepted it.)

# %%
x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], requires_grad=True)
y = f(x)
try:
    y.backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")

y.backward(gradient=torch.ones_like(y))
print("y:\n", y.detach())
print("x.grad with gradient=ones:\n", x.grad)
assert torch.equal(x.grad, 2 * a * x.detach() + b)

# %% [markdown]
# Change $g$ and the gradient changes with it: $c = p^2 + q$ with $p = [1, 3]$, $q = [2, 4]$, first with
# `gradient=[1, 1]` ($p$.grad $= 2p = [2, 6]$), then with `gradient=[1, 2]` ($p$.grad $= [2, 12]$, $q$.grad
# $= [1, 2]$). The second call needs a fresh graph: calling `backward` again on the same one raises, because the first
# call freed it (section 4). Keeping the graph with `retain_graph=True` would not give $[2, 12]$ either: the second
# gradient is *added* to the first, $[2, 6] + [2, 12] = [4, 18]$.

# %%
p_vec = torch.tensor([1.0, 3.0], requires_grad=True)
q_vec = torch.tensor([2.0, 4.0], requires_grad=True)
c_vec = p_vec**2 + q_vec
c_vec.backward(gradient=torch.tensor([1.0, 1.0]))
print("gradient [1, 1]: p.grad", p_vec.grad.tolist(), "q.grad", q_vec.grad.tolist())
try:
    c_vec.backward(gradient=torch.tensor([1.0, 2.0]))  # a second call on the same graph
except RuntimeError as err:
    print("second backward on the same graph:", type(err).__name__, "-", str(err).split(" (")[0])
p_vec.grad = q_vec.grad = None
(p_vec**2 + q_vec).backward(gradient=torch.tensor([1.0, 2.0]))  # a fresh graph
print("gradient [1, 2] on a fresh graph: p.grad", p_vec.grad.tolist(), "q.grad", q_vec.grad.tolist())
assert p_vec.grad.tolist() == [2.0, 12.0] and q_vec.grad.tolist() == [1.0, 2.0]

p_vec.grad = q_vec.grad = None
c_kept = p_vec**2 + q_vec
c_kept.backward(gradient=torch.tensor([1.0, 1.0]), retain_graph=True)
c_kept.backward(gradient=torch.tensor([1.0, 2.0]))
print("both on one kept graph:           p.grad", p_vec.grad.tolist(), "<- added up")
assert p_vec.grad.tolist() == [4.0, 18.0]

# %% [markdown]
# Passing `gradient=g` is the same as calling `backward()` on the scalar $\sum_i g_i y_i$. Take a $g$ that is not all
# ones, so that it visibly acts as one weight per output element (as when you weight several loss terms).

# %%
g = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # one weight per element of y

x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], requires_grad=True)
f(x).backward(gradient=g)
grad_vector_form = x.grad.clone()

x.grad = None
torch.sum(f(x) * g).backward()  # the scalar form
print("backward(gradient=g):\n", grad_vector_form)
print("sum(y * g).backward():\n", x.grad)
assert torch.equal(grad_vector_form, x.grad)

# %% [markdown]
# Where is the Jacobian? Autograd never builds it (for a network with millions of inputs it would not fit in memory);
# each backward formula multiplies the incoming vector by its local Jacobian directly. We can still ask for the full
# Jacobian. `torch.func` is PyTorch's library of *function transforms*: each takes a function and returns a new one,
# and `torch.func.jacrev(f)` returns the function that computes $f$'s Jacobian (the older
# `torch.autograd.functional.jacobian` gives the same). The cell checks that $g^\top J$ is exactly what
# `backward(gradient=g)` returned. The Jacobian of a `2×2 → 2×2` function has shape `(2, 2, 2, 2)`; flattened to
# `4×4` it is diagonal here, because $f$ acts element by element: that is why $g$ simply multiplies the gradients
# element-wise.

# %%
x0 = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
J = torch.func.jacrev(f)(x0)  # shape y.shape + x.shape
assert torch.equal(J, torch.autograd.functional.jacobian(f, x0))
print("Jacobian shape:", tuple(J.shape))

J2d = J.reshape(4, 4)
print("flattened to 4x4:\n" + fmt(J2d, 1))
vjp = (g.reshape(1, 4) @ J2d).reshape(2, 2)
print("g^T J, reshaped:\n" + fmt(vjp, 1))
assert torch.equal(J2d, torch.diag(2 * a * x0.flatten() + b))
assert torch.equal(vjp, grad_vector_form)

# %% [markdown]
# For a function that mixes elements the Jacobian is not diagonal, and the vector–Jacobian product really is a matrix
# product. Here $h(v)_i = \sum_{j\le i} v_j^2$ (a running sum of squares), whose Jacobian is lower-triangular with
# entries $2v_j$.


# %%
def h(v: torch.Tensor) -> torch.Tensor:
    """Running sum of squares: every output depends on several inputs."""
    return torch.cumsum(v**2, dim=0)


v = torch.tensor([1.0, -1.0, 2.0, 0.5], requires_grad=True)
w = torch.tensor([1.0, 0.0, 0.0, 1.0])  # the vector of the product
h(v).backward(gradient=w)
Jh = torch.func.jacrev(h)(v.detach())
print("Jacobian of h:\n" + fmt(Jh, 1))
print("v.grad = w^T J =", fmt(v.grad, 1))
assert torch.equal(Jh, torch.tril(2 * v.detach().expand(4, 4)))
assert torch.allclose(v.grad, w @ Jh)

# %% [markdown]
# ### Forward mode: Jacobian–vector products
#
# `backward()` is **reverse-mode** automatic differentiation: it starts at the outputs with a vector $w$ and walks the
# graph backwards, and one pass gives $w^\top J$, a weighted sum of the Jacobian's *rows*. **Forward-mode automatic
# differentiation** (前向模式自动微分) goes the other way. It starts at the inputs with a **tangent** (切向量) $u$, a
# direction in which $x$ moves, and carries next to every value it computes that value's rate of change along $u$.
# When the output is reached it holds $J u$, the **Jacobian–vector product** (雅可比-向量积): a weighted sum of the
# Jacobian's *columns*, the directional derivative of $f$ along $u$. It runs together with the forward computation,
# records no graph and keeps nothing for later.
#
# `torch.func.jvp(f, (x,), (u,))` returns the pair $(f(x), Ju)$. On $h$, $Ju$ must equal the Jacobian above times $u$.
#
# One PyTorch quirk: in 2.14 the first forward-mode call of a Python process makes PyTorch load its forward-mode
# rules, and that loading code prints a `FutureWarning` about `torch.jit.script`. The warning is about PyTorch's own
# code, not yours, and it comes once per process; the cell records it and prints it.

# %%
u = torch.tensor([1.0, 0.0, 1.0, 0.0])  # the tangent: move v[0] and v[2] together
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    h_value, Ju = torch.func.jvp(h, (v.detach(),), (u,))
for message in sorted({f"{w.category.__name__}: {w.message}" for w in caught}):  # each distinct one once
    print("from inside PyTorch:", message)
assert all("torch.jit.script" in str(warning.message) for warning in caught)
print("h(v)  =", fmt(h_value, 2))
print("J u   =", fmt(Ju, 2))
print("Jh @ u =", fmt(Jh @ u, 2))
assert torch.allclose(Ju, Jh @ u) and torch.equal(h_value, h(v.detach()))

# %% [markdown]
# **Which mode is cheaper?** For a function $f$ of $n$ inputs with $m$ outputs the full Jacobian takes $m$ reverse passes (one per
# row, with $w$ each unit vector in turn) or $n$ forward passes (one per column). A training loss has $m = 1$ output
# and millions of parameters as inputs: one reverse pass gives the whole gradient, which is why `backward()` is what
# training uses. Forward mode wins with few inputs and many outputs, for example the sensitivity of a whole curve to
# two parameters. The cell computes such a Jacobian both ways with a visible loop (`torch.func.vjp(f, x)` runs `f`
# once and returns the function $w \mapsto w^\top J$: one reverse pass per call). `torch.func.jacfwd` and
# `torch.func.jacrev` do the same passes, batched into one call (section 6 shows how, with `vmap`).

# %%
t_grid = torch.linspace(0.0, 1.0, 1000)


def curve(theta: torch.Tensor) -> torch.Tensor:
    """2 inputs -> 1000 outputs: amplitude theta[1] times a sine of frequency theta[0]."""
    return theta[1] * torch.sin(theta[0] * t_grid)


theta = torch.tensor([3.0, 0.5])
columns = [torch.func.jvp(curve, (theta,), (e,))[1] for e in torch.eye(2)]  # one forward pass per input
_, vjp_fn = torch.func.vjp(curve, theta)
rows = [vjp_fn(e)[0] for e in torch.eye(1000)]  # one reverse pass per output
J_fwd, J_rev = torch.stack(columns, dim=1), torch.stack(rows)
print(f"Jacobian {tuple(J_fwd.shape)}: forward mode took {len(columns)} passes, reverse mode {len(rows)}")
analytic = torch.stack([theta[1] * t_grid * torch.cos(theta[0] * t_grid), torch.sin(theta[0] * t_grid)], dim=1)
assert torch.allclose(J_fwd, analytic, atol=1e-6) and torch.allclose(J_rev, analytic, atol=1e-6)
assert torch.allclose(torch.func.jacfwd(curve)(theta), J_fwd) and torch.allclose(torch.func.jacrev(curve)(theta), J_rev)

# %% [markdown]
# ## 4. The graph is freed; gradients accumulate (梯度累加)
#
# PyTorch builds the graph anew at each forward pass (a *dynamic* graph) and, to save memory, frees the intermediate
# values it saved as soon as a backward pass has used them. A second `backward()` through the same graph therefore
# fails unless the first one passed `retain_graph=True`. (Notebook 03 studies the graph itself: `grad_fn` chains,
# leaves, hooks.)
#
# Take $x=3$, $y_1 = x+1$, $y_2 = 2x$, $L=(y_1-y_2)^2$. $x$ reaches $L$ along two paths, and the chain rule says the
# two contributions are **added**:
# $\frac{dL}{dx} = \frac{\partial L}{\partial y_1}\cdot 1 + \frac{\partial L}{\partial y_2}\cdot 2
# = (-4)(1) + (4)(2) = 4$.

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
dL_dy1, dL_dy2 = torch.autograd.grad(loss, [y1, y2], retain_graph=True)
loss.backward()
print("dL/dy1 =", dL_dy1.item(), "| dL/dy2 =", dL_dy2.item(), "| x.grad =", x.grad.item())
assert x.grad == dL_dy1 * 1 + dL_dy2 * 2 == 4.0

try:
    loss.backward()  # the graph's saved values are gone
except RuntimeError as err:
    print(f"{type(err).__name__}: {str(err).split('. ')[0]}.")

# %% [markdown]
# ### A closer look: where the sum happens *(deeper)*
#
# Does autograd add $-4$ into `x.grad` and then $8$? It does not. During one backward pass the engine collects
# everything that flows into a graph node in that node's *input buffer*, adds it there, and runs the node once, when
# all its inputs have arrived. For a leaf the node is `AccumulateGrad`, the node that writes `.grad`: it runs **once**,
# with 4.
#
# To watch it we use two tools that notebook 03 teaches in full. A **hook** (钩子) is a function you hand to
# autograd, which calls it with a gradient as that gradient passes: `x.register_hook(fn)` for the gradient of `x`,
# `node.register_prehook(fn)` for what a node receives. And `y1.grad_fn.next_functions` lists the nodes that feed
# `y1`'s node: here `x`'s `AccumulateGrad`, shared by both paths. Both hooks fire once, with 4, never with $-4$ and 8
# apart.

# %%
x = torch.tensor(3.0, requires_grad=True)
y1 = x + 1
y2 = 2 * x
loss = (y1 - y2) ** 2
calls = []
x.register_hook(lambda grad: calls.append(("hook on x", grad.item())))
accumulate_x = y1.grad_fn.next_functions[0][0]  # x's AccumulateGrad node, shared by both paths
print("the node behind x:", type(accumulate_x).__name__)
accumulate_x.register_prehook(lambda grad_outputs: calls.append(("AccumulateGrad", grad_outputs[0].item())))
loss.backward()
print("calls during one backward:", calls)
assert calls == [("hook on x", 4.0), ("AccumulateGrad", 4.0)]  # each once, with the sum

# %% [markdown]
# Adding into `.grad` happens *across* backward calls: `.grad` is never reset for you. Three backward passes (keeping
# the graph) run `AccumulateGrad` three times and give three times the gradient. This is the bug behind "my loss
# explodes" when `zero_grad()` is forgotten in a training loop.

# %%
x = torch.tensor(3.0, requires_grad=True)
loss = (x + 1 - 2 * x) ** 2
for i in range(3):
    loss.backward(retain_graph=True)
    print(f"after backward #{i + 1}: x.grad = {x.grad.item()}")
assert x.grad.item() == 3 * 4.0

# %% [markdown]
# Accumulation is also a tool: **gradient accumulation** (梯度累加) splits a batch that does not fit in memory into
# micro-batches, calls `backward()` on each (scaled by 1/number of micro-batches, because the loss is a mean over the
# batch) and steps once. The result equals the full-batch gradient. Below, `nn.Linear(3, 1)` (with its bias this
# time) and the default `nn.MSELoss()`, which averages; `X.chunk(4)` splits `X` into 4 equal pieces along dimension 0.
#
# To reset gradients, `model.zero_grad()` and `optimizer.zero_grad()` set `.grad` to `None` by default
# (`set_to_none=True` since PyTorch 2.0: no memory is written, and an optimizer skips a parameter whose `.grad` is
# `None`); `set_to_none=False` fills them with zeros as older versions did.

# %%
seed_everything(0)
model = nn.Linear(3, 1)
X = torch.randn(8, 3)
Y = torch.randn(8, 1)
loss_fn = nn.MSELoss()

loss_fn(model(X), Y).backward()
full_batch = [p.grad.clone() for p in model.parameters()]

model.zero_grad()
print("after model.zero_grad():", [p.grad for p in model.parameters()])
assert all(p.grad is None for p in model.parameters())

for Xc, Yc in zip(X.chunk(4), Y.chunk(4)):  # 4 micro-batches of 2 samples
    (loss_fn(model(Xc), Yc) / 4).backward()
same = all(torch.allclose(p.grad, q, atol=1e-6) for p, q in zip(model.parameters(), full_batch))
print("4 accumulated micro-batches == one full batch:", same)
assert same

opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt.zero_grad(set_to_none=False)
print("after zero_grad(set_to_none=False):", [fmt(p.grad, 1) for p in model.parameters()])
assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())

# %% [markdown]
# ## 5. Minimising a function with an optimizer (优化器)
#
# Section 1 trained a network with `torch.optim.SGD`; on a function of one variable every step can be predicted.
# Minimise section 2's $f(x) = x^2 - 2x + 1 = (x-1)^2$ with `SGD(params=[x], lr=0.01)` for 500 steps (an optimizer
# takes any list of tensors that require gradients), each step the three lines `zero_grad()` → `backward()` →
# `step()`. SGD's update is $x \leftarrow x - \eta f'(x) = x - \eta(2x - 2)$, so $x_k - 1 = (1 - 2\eta)^k (x_0 - 1)$:
# from $x_0 = 0$ we can check every step against $x_k = 1 - (1-2\eta)^k$.


# %%
def descend(lr: float, steps: int) -> torch.Tensor:
    """Run SGD on f from x=0 and return the path x_0..x_steps (float64, on the CPU)."""
    x = torch.tensor(0.0, device=device, requires_grad=True)
    optimizer = torch.optim.SGD(params=[x], lr=lr)
    path = [x.item()]
    for _ in range(steps):
        optimizer.zero_grad()
        y = f(x)
        y.backward()
        optimizer.step()
        path.append(x.item())
    return torch.tensor(path, dtype=torch.float64)


path = descend(lr=0.01, steps=500)
x_final = path[-1]
print(f"after 500 steps: x = {x_final.item():.4f}, f(x) = {f(x_final).item():.4f}")
k = torch.arange(501, dtype=torch.float64)
assert torch.allclose(path, 1 - (1 - 2 * 0.01) ** k, atol=1e-5)
assert abs(x_final.item() - 1.0) < 1e-4

# %% [markdown]
# The closed form also tells how the learning rate matters: the distance to the minimum is multiplied by
# $|1-2\eta|$ every step. $\eta = 0.01$ crawls, $\eta = 0.3$ is fast, $\eta = 0.95$ overshoots and zig-zags across the
# minimum, and $\eta > 1$ diverges. Left: the paths on the parabola; right: the distance to the minimum (dots) against
# the prediction $|1-2\eta|^k$ (lines).

# %%
lrs = [0.01, 0.3, 0.95, 1.05]
paths = {lr: descend(lr, steps=40) for lr in lrs}
k = torch.arange(41, dtype=torch.float64)
for lr, p in paths.items():
    assert torch.allclose((p - 1).abs(), abs(1 - 2 * lr) ** k, rtol=1e-4, atol=1e-6)
    print(f"lr={lr:<5} x_40 = {p[-1].item():8.4f}   |x_40 - 1| = {abs(p[-1].item() - 1):.2e}")
assert abs(paths[1.05][-1].item() - 1) > 1.0  # diverged

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
grid = torch.linspace(-1.2, 3.2, 200)
ax1.plot(grid, f(grid), color="gray", label=r"$f(x)=x^2-2x+1$")
p001 = path[::25]
ax1.plot(p001, f(p001.float()), "o", color="tab:blue", label="lr=0.01, every 25th of 500 steps")
p095 = paths[0.95][:12]
ax1.plot(p095, f(p095.float()), "o-", color="tab:red", lw=1, ms=4, label="lr=0.95, first 11 steps")
ax1.set_xlabel("x")
ax1.set_ylabel("f(x)")
ax1.set_title("SGD paths on the parabola")
ax1.legend(fontsize=8)
for lr, p in paths.items():
    line = ax2.semilogy(k, abs(1 - 2 * lr) ** k, lw=1)[0]
    dist = (p - 1).abs()
    nonzero = dist > 0  # lr=0.3 lands exactly on 1.0 in float32 after ~19 steps
    ax2.semilogy(k[nonzero], dist[nonzero], ".", color=line.get_color(), label=f"lr={lr}")
ax2.set_xlabel("step k")
ax2.set_ylabel("|x_k - 1|")
ax2.set_title(r"distance to the minimum vs $|1-2\eta|^k$")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 6. Custom Functions (自定义算子)
#
# Every node of the graph knows how to compute its output (`forward`) and how to turn the gradient of its output into
# gradients of its inputs (`backward`). PyTorch brings one for each operation (`AddBackward0`, `MulBackward0`, ...).
# You can write your own, a **custom Function** (自定义算子), by subclassing `torch.autograd.Function` with two static
# methods:
#
# * `forward(ctx, *inputs)` computes the result; `ctx.save_for_backward(...)` stores the **tensors** that backward
#   will need, other values can be stored as attributes of `ctx`;
# * `backward(ctx, grad_output)` receives $\partial L/\partial\,\text{output}$ and returns one gradient per input of
#   `forward` (`None` for inputs that have no gradient).
#
# You call it through `.apply(...)`, never by instantiating the class.
#
# ### `MyReLU`
#
# A ReLU that saves its input and zeroes the gradient where the input was negative. We use it in a tiny linear model,
# $\hat Y = \mathrm{ReLU}(X w^\top + b)$ with a mean squared error, and check that the gradients equal those of the
# built-in `torch.relu`. `torch.autograd.gradcheck(fn, inputs)` then compares the backward with finite differences
# (section 7 explains it). Look at the shapes: `Y_hat` is `(2, 1)` and `Y` is `(1, 2)`, so `Y_hat - Y` silently
# broadcasts to `2×2`. The example runs, but every prediction is compared with both targets: probably not what was
# meant, and a classic bug of loss functions. The gradients `4.5` come from that `2×2` difference.


# %%
class MyReLU(Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)  # backward needs to know where input < 0
        return input.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input < 0] = 0
        return grad_input


def relu_model_grads(relu):
    w = torch.tensor([[3.0, 1.0]], requires_grad=True)
    b = torch.tensor([[3.0]], requires_grad=True)
    X = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    Y = torch.tensor([[2.0, 3.0]])
    Y_hat = relu(X @ w.t() + b)
    loss = torch.mean(torch.pow(Y_hat - Y, 2))
    loss.backward()
    return w.grad, b.grad, Y_hat, (Y_hat - Y).shape


w_grad, b_grad, Y_hat, diff_shape = relu_model_grads(MyReLU.apply)
print("w.grad:", w_grad, "| b.grad:", b_grad, "| Y_hat - Y has shape", tuple(diff_shape))
print("Y_hat.grad_fn:", type(Y_hat.grad_fn).__name__)
w_ref, b_ref, _, _ = relu_model_grads(torch.relu)
assert torch.equal(w_grad, w_ref) and torch.equal(b_grad, b_ref)
assert torch.equal(w_grad, torch.tensor([[4.5, 4.5]]))

# %% [markdown]
# One subtle difference: at exactly 0 ReLU has a kink and no derivative. Any slope between 0 and 1 is a valid choice
# there (a *subgradient*, 次梯度: the slope of a line through the kink that stays below the graph). `MyReLU` lets the
# gradient through at 0 (it only zeroes `input < 0`), the built-in chooses 0. A numerical check at 0 would flag
# either, so `gradcheck` below stays away from the kink.

# %%
z = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
(g_mine,) = torch.autograd.grad(MyReLU.apply(z).sum(), z)
(g_builtin,) = torch.autograd.grad(torch.relu(z).sum(), z)
print("at z = [-1, 0, 2]:  MyReLU grad", g_mine.tolist(), "| torch.relu grad", g_builtin.tolist())
assert g_mine[1] == 1.0 and g_builtin[1] == 0.0

z64 = (torch.rand(20, dtype=torch.float64) + 0.1) * torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(10)
assert torch.autograd.gradcheck(MyReLU.apply, (z64.requires_grad_(),))
print("gradcheck(MyReLU) away from 0: passed")

# %% [markdown]
# ### `Exp`: saving the output
#
# For $e^x$ the derivative is the output itself, so `Exp` saves its **result** rather than its input, then
# multiplies: $\partial L/\partial x = \partial L/\partial y \cdot e^x$. At $x=1$ the gradient is $e \approx 2.7183$.


# %%
class Exp(Function):
    @staticmethod
    def forward(ctx, i):
        result = i.exp()
        ctx.save_for_backward(result)  # saved tensors come back as ctx.saved_tensors
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


x = torch.tensor([1.0], requires_grad=True)
ret = Exp.apply(x)
ret.backward()
print("Exp(1) =", fmt(ret), "| grad =", fmt(x.grad), "| grad_fn:", type(ret.grad_fn).__name__)
assert torch.allclose(x.grad, torch.exp(torch.tensor([1.0])))
assert torch.autograd.gradcheck(Exp.apply, (torch.randn(5, dtype=torch.float64, requires_grad=True),))

# %% [markdown]
# ### `GradCoeff`: a non-tensor argument and a `None` gradient
#
# `GradCoeff.apply(x, coeff)` is the identity going forward but multiplies the gradient by `coeff` going backward.
# With a negative `coeff` it reverses the gradient: a *gradient reversal layer*, which trains the layers before it to
# make a later classifier *worse* (used to learn features that do not reveal, say, which dataset an image came
# from). `coeff` is a Python float, so it is stored as an attribute of `ctx` (`save_for_backward` is for tensors).
# `backward` must return **one value per input of forward**, so it returns `None` for `coeff`.
#
# The forward returns `x.view_as(x)`, as older code does; returning `x` itself works as well. Autograd notices that
# an input is returned unchanged and hands back a new tensor, a view of `x` (`y._base is x`), that carries the
# Function's `grad_fn`: the second half of the cell checks it. `view_as` only makes that explicit.
#
# With $x=2$, $L = (\text{GradCoeff}(x, -0.1))^2$: the forward value is $4$ and the gradient $2x \cdot (-0.1) = -0.4$.
# Forgetting the `None` is an error.


# %%
class GradCoeff(Function):
    @staticmethod
    def forward(ctx, x, coeff):
        ctx.coeff = coeff  # a plain float: keep it on ctx
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return ctx.coeff * grad_output, None  # no gradient for coeff


x = torch.tensor([2.0], requires_grad=True)
ret = GradCoeff.apply(x, -0.1) ** 2
ret.backward()
print("forward:", fmt(ret), "| x.grad:", fmt(x.grad))
assert torch.equal(ret.detach(), x.detach() ** 2)
assert torch.allclose(x.grad, torch.tensor([-0.4]))


class GradCoeffReturnsInput(GradCoeff):
    @staticmethod
    def forward(ctx, x, coeff):
        ctx.coeff = coeff
        return x  # the input itself


x.grad = None
out = GradCoeffReturnsInput.apply(x, -0.1)
(out**2).backward()
print(
    f"returning x: out is x {out is x}, out._base is x {out._base is x}, "
    f"grad_fn {type(out.grad_fn).__name__}, x.grad {fmt(x.grad)}"
)
assert out is not x and out._base is x and torch.allclose(x.grad, torch.tensor([-0.4]))


class GradCoeffMissingNone(GradCoeff):
    @staticmethod
    def backward(ctx, grad_output):
        return ctx.coeff * grad_output  # one value for two inputs


try:
    GradCoeffMissingNone.apply(x, -0.1).sum().backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# ### `LinearFunction` and `ctx.needs_input_grad`
#
# A linear layer $y = xW^\top + b$ with `x` of shape `(N, in)`, `W` of shape `(out, in)` and `b` of shape `(out,)`.
# Its backward follows from section 1.1's rule for a matrix product $Y = AB$ ($\partial L/\partial A = GB^\top$,
# $\partial L/\partial B = A^\top G$), with $A = x$, $B = W^\top$ and $G = \partial L/\partial y$:
#
# * $\partial L/\partial x = G\,W$, shape `(N, in)`;
# * $\partial L/\partial W^\top = x^\top G$, so $\partial L/\partial W = G^\top x$, shape `(out, in)`;
# * $b$ is added to every row (broadcast), so each row's gradient reaches it: $\partial L/\partial b$ is $G$ summed
#   over the rows, `G.sum(0)`.
#
# Three inputs, so backward returns three gradients. `ctx.needs_input_grad` is a tuple of booleans, one per input of
# forward, telling backward which gradients are actually wanted, so it can skip work (here: when the data `input` does
# not require a gradient, the matrix product for `grad_input` is skipped). Returning gradients nobody asked for is not
# an error, only waste. The class records what it saw so we can print it, and we compare with the built-in `F.linear`
# (the function behind `nn.Linear`) and with `gradcheck`.


# %%
class LinearFunction(Function):
    seen_needs_input_grad: list = []  # for the demonstration only

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        LinearFunction.seen_needs_input_grad.append(ctx.needs_input_grad)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


seed_everything(0)
inp = torch.randn(4, 3, dtype=torch.float64)  # data: no gradient wanted
weight = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
bias = torch.randn(2, dtype=torch.float64, requires_grad=True)

out = LinearFunction.apply(inp, weight, bias)
grads = torch.autograd.grad(out.square().sum(), [weight, bias])
print("needs_input_grad (input, weight, bias):", LinearFunction.seen_needs_input_grad[-1])
ref_out = F.linear(inp, weight, bias)
ref_grads = torch.autograd.grad(ref_out.square().sum(), [weight, bias])
assert torch.allclose(out, ref_out) and all(torch.allclose(p, q) for p, q in zip(grads, ref_grads))

out_nobias = LinearFunction.apply(inp, weight)  # bias defaults to None
assert torch.allclose(out_nobias, inp @ weight.T)
assert torch.autograd.gradcheck(LinearFunction.apply, (inp.clone().requires_grad_(), weight, bias))
print("needs_input_grad during gradcheck:      ", LinearFunction.seen_needs_input_grad[-1])
print("matches F.linear and passes gradcheck")

# %% [markdown]
# ### Custom Functions under `torch.func`: `setup_context`, `vmap`, `jvp` *(deeper)*
#
# The classic style above (`forward(ctx, ...)`) is fine for `backward()` and `autograd.grad`. The function transforms
# of `torch.func` (`jacrev`, `grad`, `vmap`, `jvp`, ...) however need `forward` *without* `ctx` and a separate
# `setup_context(ctx, inputs, output)` that saves what backward needs. Only the split differs; `backward` is
# unchanged. With it, `jacrev` works:


# %%
class ExpV2(Function):
    @staticmethod
    def forward(i):  # no ctx here
        return i.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


x3 = torch.tensor([0.0, 1.0, 2.0])
try:
    torch.func.jacrev(Exp.apply)(x3)
except RuntimeError as err:
    print("classic Exp under jacrev:", type(err).__name__, "-", str(err).split(". ")[0])
J_exp = torch.func.jacrev(ExpV2.apply)(x3)
print("ExpV2 under jacrev:\n" + fmt(J_exp))
assert torch.allclose(J_exp, torch.diag(x3.exp()))

# %% [markdown]
# **What `vmap` does.** `torch.func.vmap(fn)`, the **vectorizing map** (向量化映射), turns a function written for one
# example into one that takes a whole batch along dimension 0: `vmap(fn)(X)` equals
# `torch.stack([fn(row) for row in X])`, computed in one call instead of a Python loop. `jacrev` and `jacfwd` use it to
# run all their passes (one per row or column of the Jacobian) at once.

# %%
weights = torch.tensor([1.0, -1.0, 2.0])


def score(row: torch.Tensor) -> torch.Tensor:
    """Written for one example: a dot product and a square."""
    return (row @ weights) ** 2


batch = torch.arange(6.0).reshape(2, 3)
looped = torch.stack([score(row) for row in batch])
vmapped = torch.func.vmap(score)(batch)
print("loop:", looped.tolist(), "| vmap:", vmapped.tolist())
assert torch.equal(looped, vmapped)

# %% [markdown]
# A custom Function under `vmap` needs one more thing: a rule for running it on a batch. Either write a `vmap` static
# method, or set `generate_vmap_rule = True`, which lets PyTorch derive the rule by running `forward`/`backward`
# under `vmap` themselves (possible when they are made of PyTorch operations, as here).

# %%
batch3 = torch.stack([x3, x3 + 1])
try:
    torch.func.vmap(ExpV2.apply)(batch3)
except RuntimeError as err:
    print("ExpV2 under vmap:", type(err).__name__, "-", str(err).split(". ")[0])


class ExpV3(ExpV2):
    generate_vmap_rule = True


batched = torch.func.vmap(ExpV3.apply)(batch3)
print("ExpV3 (generate_vmap_rule = True) under vmap: shape", tuple(batched.shape))
assert torch.allclose(batched, batch3.exp())

# %% [markdown]
# **Forward mode needs a `jvp`.** `torch.func.jvp` and `jacfwd` (which is `vmap` over `jvp`) run forward mode
# (section 3), and forward mode never calls `backward`: it pushes a tangent through each operation. A custom Function
# therefore needs a third static method, `jvp(ctx, *tangents)`, which receives one tangent per input of forward and
# returns the tangent of the output, $\frac{\partial\,\text{output}}{\partial\,\text{input}}\cdot$ tangent. Tensors it
# needs are saved in `setup_context` with `ctx.save_for_forward(...)` (`save_for_backward` serves `backward`); both come
# back as `ctx.saved_tensors`. For $e^x$ the tangent of the output is tangent $\times\, e^x$.

# %%
try:
    torch.func.jacfwd(ExpV3.apply)(x3)
except NotImplementedError as err:
    print("ExpV3 under jacfwd:", type(err).__name__, "-", err)


class ExpV4(ExpV3):
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)  # for jvp

    @staticmethod
    def jvp(ctx, x_tangent):
        (result,) = ctx.saved_tensors
        return x_tangent * result


J_fwd_exp = torch.func.jacfwd(ExpV4.apply)(x3)
_, exp_tangent = torch.func.jvp(ExpV4.apply, (x3,), (torch.ones(3),))
print("ExpV4 under jacfwd:\n" + fmt(J_fwd_exp))
print("jvp with tangent [1, 1, 1]:", fmt(exp_tangent))
assert torch.allclose(J_fwd_exp, J_exp) and torch.allclose(exp_tangent, x3.exp())

# %% [markdown]
# ## 7. Checking a Function: `gradcheck` and `gradgradcheck` (梯度检查)
#
# A hand-written `backward` is easy to get wrong, and a wrong gradient does not crash: training just goes badly. A
# **gradient check** (梯度检查), `torch.autograd.gradcheck(fn, inputs)`, compares your analytical Jacobian with a
# numerical one from central finite differences $\frac{f(x+\epsilon)-f(x-\epsilon)}{2\epsilon}$, and
# `gradgradcheck` does the same for the second derivative (the backward of your backward).
#
# `Square` writes its backward with ordinary differentiable tensor operations (`grad_out * 2 * x`), so autograd can
# record the backward too and double backward works for free. Below, a buggy `Square` that forgets the factor 2 is
# caught by `gradcheck`.


# %%
class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # an input is saved with save_for_backward
        return x**2

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x  # differentiable ops: double backward works


class BuggySquare(Square):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * x  # forgot the 2


seed_everything(0)
x = torch.rand(3, 3, requires_grad=True, dtype=torch.double)  # float64: see the next cell
print("gradcheck(Square):    ", torch.autograd.gradcheck(Square.apply, x))
print("gradgradcheck(Square):", torch.autograd.gradgradcheck(Square.apply, x))
try:
    torch.autograd.gradcheck(BuggySquare.apply, x)
except RuntimeError as err:  # GradcheckError is a RuntimeError
    print("gradcheck(BuggySquare):", type(err).__name__, "-", str(err).splitlines()[0])
else:
    raise AssertionError("gradcheck should have caught the bug")

# %% [markdown]
# **Why float64.** Finite differences subtract two nearly equal numbers and divide by a tiny $\epsilon$ (gradcheck
# uses $10^{-6}$). In float32, whose spacing near 1 is about $10^{-7}$, that rounding error is amplified to the percent
# level, so a correct backward would look wrong. In float64 the error is negligible.

# %%
for dtype in (torch.float32, torch.float64):
    x_ = torch.tensor(0.7, dtype=dtype)
    eps = 1e-6
    numerical = ((x_ + eps) ** 2 - (x_ - eps) ** 2) / (2 * eps)
    error = abs(numerical.item() - 1.4)
    print(f"{str(dtype):14} d(x^2)/dx at 0.7 ~ {numerical.item():.6f}   error {error:.0e}")
    assert (error > 1e-3) if dtype == torch.float32 else (error < 1e-8)

# %% [markdown]
# ### `once_differentiable`
#
# Decorating `backward` with `@once_differentiable` runs it with autograd switched off, so its result cannot be
# differentiated again. Use it when `backward` is written with operations autograd cannot follow (NumPy, a C
# extension, in-place tricks): it then marks the result so that a *second* backward through it raises instead of
# computing nonsense. (If such a backward must be differentiable after all, write it as a second custom Function
# with a backward of its own, as PyTorch's tutorial on double backward does.) When `backward` is made of PyTorch
# operations, leave the decorator out: double backward then works for free. The same `Square` with the decorator still passes `gradcheck` but fails `gradgradcheck`, whose message shows
# the second derivative it got: zeros.


# %%
class SquareOnce(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * x


print("gradcheck(SquareOnce):", torch.autograd.gradcheck(SquareOnce.apply, x))
try:
    torch.autograd.gradgradcheck(SquareOnce.apply, x)
except RuntimeError as err:
    print("gradgradcheck(SquareOnce):", type(err).__name__, "-", str(err).splitlines()[0])
    analytical = str(err).split("analytical:")[1].split("dtype")[0]
    assert not any(ch in "123456789" for ch in analytical)  # every entry of the analytical matrix is 0
    print("  the analytical second derivative it reports: all zeros")
else:
    raise AssertionError("gradgradcheck should fail for a once-differentiable backward")

# %% [markdown]
# **It is not a safety net.** The decorator only raises when the *plain* `.backward()` walks into it. Take a data
# term $L_0 = w \sum_i x_i^2$ with $w = 2$, $x = [0.5, 1.5]$, and add a *gradient penalty*, the squared norm of its
# gradient with respect to $x$ (section 9 trains a model with one): $L = L_0 + \lVert \partial L_0/\partial x
# \rVert^2 = w\sum x_i^2 + 4w^2 \sum x_i^2$. The true $dL/dw = \sum x_i^2 + 8w\sum x_i^2 = 2.5 + 40 = 42.5$.
# Computed with `torch.autograd.grad(total, [w])` through `SquareOnce`, there is no error: the penalty's path through
# the once-differentiable backward is silently skipped, and the gradient is that of the data term alone, 2.5.


# %%
def penalty_gradient(square_fn):
    """(L, w) for L = L0 + ||dL0/dx||^2 with L0 = w * sum(square_fn(x)), w = 2, x = [0.5, 1.5]."""
    w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    xs = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    data_term = (w * square_fn(xs)).sum()
    (dx,) = torch.autograd.grad(data_term, xs, create_graph=True)  # the penalty's inner gradient
    total = data_term + dx.square().sum()
    return total, w


for fn in (Square, SquareOnce):
    total, w = penalty_gradient(fn.apply)
    (dw,) = torch.autograd.grad(total, [w])
    print(f"{fn.__name__:10} autograd.grad -> dL/dw = {dw.item()}")
total, w = penalty_gradient(SquareOnce.apply)
try:
    total.backward()
except RuntimeError as err:
    print(f"SquareOnce .backward()     -> {type(err).__name__}: {err}")
assert torch.autograd.grad(*penalty_gradient(Square.apply))[0].item() == 42.5
assert torch.autograd.grad(*penalty_gradient(SquareOnce.apply))[0].item() == 2.5  # the penalty term is lost

# %% [markdown]
# ### Saving intermediate results: the double-backward trap
#
# `forward` runs with autograd switched off, so every tensor it computes is a constant for autograd, with no path back
# to the input. Saving the **input** (`Square`) or the **output** (`Exp`) is safe: during double backward autograd
# reconnects them to the graph (the end of this section shows it). Saving an **intermediate** result breaks the
# second derivative, without an error.
#
# $\sinh x = (e^x - e^{-x})/2$ has derivative $\cosh x = (e^x + e^{-x})/2$, so it is tempting to compute $e^x$ and
# $e^{-x}$ once in forward and save both. `SinhSavesIntermediates` does that. Its first derivative is right; its
# second derivative treats $e^{\pm x}$ as constants. With $L = \sinh(x)^2$: $dL/dx = \sinh 2x$ and the true
# $d^2L/dx^2 = 2\cosh 2x$, but the saved intermediates give $2\cosh^2 x$.
#
# The fix is to make the intermediates outputs of the Function, so that autograd records them: `forward` returns
# them too, `backward` receives one gradient per output and adds their contributions (here $e^x$ and $-e^{-x}$ times
# the gradients of those outputs), and a wrapper returns only the first output. A simpler fix, when recomputing is
# cheap, is to save the input and recompute in backward (`grad_out * torch.cosh(x)`).


# %%
class SinhSavesIntermediates(Function):
    @staticmethod
    def forward(ctx, x):
        exp_x, exp_neg_x = torch.exp(x), torch.exp(-x)
        ctx.save_for_backward(exp_x, exp_neg_x)  # intermediates: constants for autograd
        return (exp_x - exp_neg_x) / 2

    @staticmethod
    def backward(ctx, grad_out):
        exp_x, exp_neg_x = ctx.saved_tensors
        return grad_out * (exp_x + exp_neg_x) / 2


class SinhWithOutputs(Function):
    @staticmethod
    def forward(ctx, x):
        exp_x, exp_neg_x = torch.exp(x), torch.exp(-x)
        ctx.save_for_backward(exp_x, exp_neg_x)  # now outputs, so autograd can reconnect them
        return (exp_x - exp_neg_x) / 2, exp_x, exp_neg_x

    @staticmethod
    def backward(ctx, grad_out, grad_exp_x, grad_exp_neg_x):
        exp_x, exp_neg_x = ctx.saved_tensors
        return grad_out * (exp_x + exp_neg_x) / 2 + grad_exp_x * exp_x - grad_exp_neg_x * exp_neg_x


def sinh_fixed(x):
    return SinhWithOutputs.apply(x)[0]  # the caller sees one output


xs = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
print("true d2L/dx2 = 2 cosh(2x):", fmt(2 * torch.cosh(2 * xs.detach())))
for name, fn in (("saves intermediates", SinhSavesIntermediates.apply), ("returns them", sinh_fixed)):
    (d1,) = torch.autograd.grad(fn(xs).square().sum(), xs, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), xs)
    passed = torch.autograd.gradgradcheck(fn, (xs,), raise_exception=False)
    print(f"{name:20}: dL/dx {fmt(d1)}, d2L/dx2 {fmt(d2)}, gradgradcheck passes: {passed}")
    assert torch.allclose(d1, torch.sinh(2 * xs.detach()))
    expected_d2 = 2 * torch.cosh(xs.detach()) ** 2 if name.startswith("saves") else 2 * torch.cosh(2 * xs.detach())
    assert torch.allclose(d2, expected_d2) and passed == name.startswith("returns")

# %% [markdown]
# What does `backward` receive? The cell looks inside it, under `create_graph=True`. The saved input is `x` itself,
# a leaf that requires grad; the saved output comes back connected to the graph, with the Function's own node as
# its `grad_fn`, so `grad_output * result` is differentiable again. A saved intermediate comes back as it was made
# in `forward`: no `grad_fn`, no `requires_grad`, a constant.


# %%
class SquarePeek(Square):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        seen["saved input"] = x
        return grad_out * 2 * x


class ExpPeek(Exp):
    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        seen["saved output"] = result
        return grad_output * result


class SinhPeek(SinhSavesIntermediates):
    @staticmethod
    def backward(ctx, grad_out):
        exp_x, exp_neg_x = ctx.saved_tensors
        seen["saved intermediate"] = exp_x
        return grad_out * (exp_x + exp_neg_x) / 2


seen = {}
x = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
for fn in (SquarePeek, ExpPeek, SinhPeek):
    torch.autograd.grad(fn.apply(x).sum(), x, create_graph=True)
for what, t in seen.items():
    print(f"{what:18}: grad_fn {type(t.grad_fn).__name__ if t.grad_fn else None}, requires_grad {t.requires_grad}")
assert seen["saved input"] is x
assert type(seen["saved output"].grad_fn).__name__ == "ExpPeekBackward"
assert seen["saved intermediate"].grad_fn is None and not seen["saved intermediate"].requires_grad

# %% [markdown]
# ### A 2-D convolution as a Function *(deeper)*
#
# A **convolution** (卷积) slides a small weight tensor, the kernel, over an image and takes a weighted sum of the
# pixels under it at each position; `F.conv2d(X, weight)` does it for a batch `X` of shape (images, channels, height,
# width) and a weight of shape (output channels, input channels, kernel height, kernel width). Notebook 04 explains
# convolutions with pictures. Its backward uses two identities, for a convolution without bias, stride 1 and no
# padding:
#
# * gradient w.r.t. the input = a **transposed convolution** (转置卷积) of `grad_out` with the same weight: it spreads
#   each output value back over the input pixels it was computed from;
# * gradient w.r.t. the weight = a convolution of the input with `grad_out`, with the batch and channel dimensions
#   swapped (`transpose(0, 1)`) so that the sum over the batch becomes the sum over "channels" that `conv2d`
#   performs.
#
# This is the custom Function of PyTorch's tutorial on fusing convolution and batch norm. We check it with
# `gradcheck` in float64, and against the gradients of the built-in `F.conv2d` with `torch.testing.assert_close`
# (notebook 01 §7), here with its tolerances set explicitly: `rtol=0, atol=1e-10`.


# %%
def convolution_backward(grad_out, X, weight):
    grad_weight = F.conv2d(X.transpose(0, 1), grad_out.transpose(0, 1)).transpose(0, 1)
    grad_X = F.conv_transpose2d(grad_out, weight)
    return grad_X, grad_weight


class Conv2D(Function):
    @staticmethod
    def forward(ctx, X, weight):
        ctx.save_for_backward(X, weight)
        return F.conv2d(X, weight)

    @staticmethod
    @once_differentiable  # not needed: Conv2DTwice below does without it
    def backward(ctx, grad_out):
        X, weight = ctx.saved_tensors
        return convolution_backward(grad_out, X, weight)


seed_everything(0)
weight = torch.rand(5, 3, 3, 3, requires_grad=True, dtype=torch.double, device=device)
X = torch.rand(10, 3, 7, 7, requires_grad=True, dtype=torch.double, device=device)
print("gradcheck(Conv2D):", torch.autograd.gradcheck(Conv2D.apply, (X, weight)))

out = Conv2D.apply(X, weight)
print("output shape:", tuple(out.shape))
mine = torch.autograd.grad(out.sin().sum(), [X, weight])
builtin = torch.autograd.grad(F.conv2d(X, weight).sin().sum(), [X, weight])
for p, q in zip(mine, builtin):
    torch.testing.assert_close(p, q, rtol=0, atol=1e-10)
print("gradients (input, weight) shaped", [tuple(g.shape) for g in mine], "equal those of F.conv2d within 1e-10")

# %% [markdown]
# Asking for a second derivative through it with `.backward()` raises (with `autograd.grad` it could be silently
# dropped, as shown above). Here the decorator is not even needed: `convolution_backward` is made of `conv2d` and
# `conv_transpose2d`, which autograd can differentiate, so without it the Function is twice differentiable and passes
# `gradgradcheck` (on smaller shapes, to keep the numerical check quick).

# %%
out = Conv2D.apply(X, weight)
(gX,) = torch.autograd.grad(out.pow(2).sum(), X, create_graph=True)
try:
    gX.sum().backward()
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")
else:
    raise AssertionError("double backward through Conv2D should fail")


class Conv2DTwice(Conv2D):  # the same forward
    @staticmethod
    def backward(ctx, grad_out):  # no decorator: built from differentiable operations
        X, weight = ctx.saved_tensors
        return convolution_backward(grad_out, X, weight)


small = (
    torch.rand(2, 2, 5, 5, dtype=torch.double, device=device, requires_grad=True),
    torch.rand(3, 2, 3, 3, dtype=torch.double, device=device, requires_grad=True),
)
print("gradgradcheck(Conv2DTwice):", torch.autograd.gradgradcheck(Conv2DTwice.apply, small))

# %% [markdown]
# ## 8. `backward` versus `autograd.grad`
#
# The two are one engine behind two doors. `Tensor.backward` calls `torch.autograd.backward`, and both that and
# `torch.autograd.grad` call the same autograd engine through `_engine_run_backward`; the one difference is a flag,
# `accumulate_grad=True` for `backward` (results are **added into `.grad`** of the leaves, nothing is returned) and
# `accumulate_grad=False` for `grad` (results are **returned**, `.grad` is untouched). PyTorch 1.x called the engine
# as `Variable._execution_engine.run_backward`, with the same flags. The cell reads the installed source:

# %%
src_tensor_backward = inspect.getsource(torch.Tensor.backward)
src_backward = inspect.getsource(torch.autograd.backward)
src_grad = inspect.getsource(torch.autograd.grad)
print("Tensor.backward calls torch.autograd.backward:", "torch.autograd.backward(" in src_tensor_backward)
print("autograd.backward -> engine with accumulate_grad=True: ", "accumulate_grad=True" in src_backward)
print("autograd.grad     -> engine with accumulate_grad=False:", "accumulate_grad=False" in src_grad)
assert "torch.autograd.backward(" in src_tensor_backward
assert "_engine_run_backward(" in src_backward and "_engine_run_backward(" in src_grad
assert "accumulate_grad=True" in src_backward and "accumulate_grad=True" not in src_grad

# %% [markdown]
# The behaviour that follows, on a two-parameter expression: `grad` returns and leaves `.grad` alone; `backward`
# returns `None` and accumulates; `backward(inputs=[...])` accumulates only into the tensors you list.

# %%
p = torch.tensor(2.0, requires_grad=True)
q = torch.tensor(3.0, requires_grad=True)
loss = p**2 * q  # d/dp = 2pq = 12, d/dq = p^2 = 4

returned = torch.autograd.grad(loss, [p, q], retain_graph=True)
print("autograd.grad returned", [r.item() for r in returned], "| p.grad, q.grad:", p.grad, q.grad)
assert p.grad is None and q.grad is None

result = loss.backward(retain_graph=True)
print("backward returned", result, "| p.grad, q.grad:", p.grad.item(), q.grad.item())
loss.backward(inputs=[p])
print("backward(inputs=[p]) again  | p.grad, q.grad:", p.grad.item(), q.grad.item())
assert (p.grad.item(), q.grad.item()) == (24.0, 4.0)

# %% [markdown]
# ### `retain_graph` defaults to `create_graph`
#
# Both functions take `retain_graph=None` and then set `retain_graph = create_graph`. So a call with
# `create_graph=True` keeps the graph as well: a later `backward()` through the same graph still works, which is what
# section 9's recipe relies on. A plain call frees it.

# %%
for name, src in (("autograd.backward", src_backward), ("autograd.grad", src_grad)):
    print(f"{name:17}:", [line.strip() for line in src.splitlines() if "retain_graph = create_graph" in line])
    assert "if retain_graph is None:\n        retain_graph = create_graph" in src

for create_graph in (True, False):
    p = torch.tensor(2.0, requires_grad=True)
    loss = p**3
    torch.autograd.grad(loss, p, create_graph=create_graph)  # retain_graph not given
    try:
        loss.backward()
        print(f"create_graph={create_graph!s:5}: a later backward() works, p.grad = {p.grad.item()}")
    except RuntimeError as err:
        print(f"create_graph={create_graph!s:5}: a later backward() fails: {str(err).split(' (')[0]}")
    assert (p.grad is not None) == create_graph

# %% [markdown]
# ### `allow_unused`: inputs the output does not depend on
#
# Asking `autograd.grad` for the gradient with respect to a tensor the output does not depend on is an error, since
# it usually means a bug (a layer left out of the forward pass). When it is expected, as for a gradient over all the
# parameters of a model whose current loss uses only some of its parts, `allow_unused=True` returns `None` for
# those, and `materialize_grads=True` returns zeros instead. (`backward()` simply leaves their `.grad` alone.)
#
# The signature of `autograd.grad` has one more argument, `only_inputs`, which older code passes. It is ignored
# (gradients are only ever returned for `inputs`), and `only_inputs=False` warns. `show_warning(fn, category, text)`,
# a helper of the course, runs `fn` and prints the warning it raises.

# %%
used, unused = nn.Linear(3, 1), nn.Linear(3, 1)  # a loss that uses only the first layer
params = list(used.parameters()) + list(unused.parameters())
loss = used(torch.ones(2, 3)).sum()
try:
    torch.autograd.grad(loss, params, retain_graph=True)
except RuntimeError as err:
    print(f"{type(err).__name__}: {err}")
grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
print("allow_unused=True:     ", [None if g is None else tuple(g.shape) for g in grads])
grads0 = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True, materialize_grads=True)
print("materialize_grads=True:", [fmt(g, 1) for g in grads0[2:]], "for the unused layer")
assert grads[2] is None and grads[3] is None and all(torch.count_nonzero(g) == 0 for g in grads0[2:])

used(torch.ones(2, 3)).sum().backward()
print("after backward(): unused.weight.grad =", unused.weight.grad, "| used.weight.grad:", fmt(used.weight.grad, 1))
assert unused.weight.grad is None and used.weight.grad is not None

_ = show_warning(lambda: torch.autograd.grad(loss, params[:2], only_inputs=False), FutureWarning, "only_inputs")

# %% [markdown]
# ## 9. Gradient penalty (梯度惩罚)
#
# A **gradient penalty** (梯度惩罚) adds the norm of the loss's gradient with respect to the parameters to the loss
# itself (it favours flat regions of the loss; a variant penalises the gradient with respect to the *inputs* instead,
# as the WGAN-GP method for training image generators does, with the same mechanics). The recipe, per step:
#
# 1. `grad_params = torch.autograd.grad(loss, model.parameters(), create_graph=True)`: the gradients are returned
#    (every `p.grad` is still `None`), and thanks to `create_graph=True` they are themselves part of a graph;
# 2. `grad_norm = sqrt(sum of squares)`, `loss = loss + grad_norm`;
# 3. `loss.backward()` fills `p.grad` with the gradient of loss *and* penalty (a second derivative flows through step
#    1's graph), then `optimizer.step()`.
#
# We check the claims on one step, on a small network of section 1's layers (`nn.Tanh()` is the activation
# $\tanh$). `.grad` is untouched after step 1. Without `create_graph=True` the recipe breaks in one of two ways: with
# no flag at all, `autograd.grad` frees the graph (as `backward` does) and the final `backward()` fails; with only
# `retain_graph=True` it runs, but the penalty is a constant with no graph and **silently changes nothing**. With
# `create_graph=True` the gradients equal an independent computation with `torch.func`: `torch.func.grad(fn)` returns
# the gradient function of a scalar function `fn`, and `torch.func.functional_call(model, params, (X,))` runs the model
# with the parameters taken from the dictionary `params`, so that the loss becomes a function of them. The reference
# is a `grad` of a function that itself contains a `grad`.
#
# This recipe appears in PyTorch's mixed-precision examples: with mixed precision the gradients are scaled and must be
# unscaled before the norm (notebook 07; older code imports the tools from `torch.cuda.amp`, today `torch.amp`).

# %%
seed_everything(0)
model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
X = torch.randn(64, 2, device=device)
Y = torch.sin(3 * X[:, :1]) * X[:, 1:]
loss_fn = nn.MSELoss()


def penalised_loss(**grad_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1 and 2 of the recipe: (loss + grad_norm, grad_norm)."""
    loss = loss_fn(model(X), Y)
    grad_params = torch.autograd.grad(loss, list(model.parameters()), **grad_kwargs)
    assert all(p.grad is None for p in model.parameters())  # returned, not accumulated
    grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in grad_params))
    return loss + grad_norm, grad_norm


model.zero_grad()
loss_fn(model(X), Y).backward()
plain = {n: p.grad.clone() for n, p in model.named_parameters()}

model.zero_grad()
total, grad_norm = penalised_loss()  # no create_graph: autograd.grad frees the graph
try:
    total.backward()
except RuntimeError as err:
    print("no create_graph:    ", type(err).__name__, "-", str(err).split(" (")[0])

model.zero_grad()
total, grad_norm = penalised_loss(retain_graph=True)  # graph kept, but no graph of the gradients
total.backward()
print("retain_graph only:   grad_norm requires_grad =", grad_norm.requires_grad)
ignored = all(torch.equal(p.grad, plain[n]) for n, p in model.named_parameters())
print("  -> gradients identical to the plain loss's (penalty ignored):", ignored)
assert ignored

model.zero_grad()
total, grad_norm = penalised_loss(create_graph=True)
total.backward()
penalised = {n: p.grad.clone() for n, p in model.named_parameters()}
print("create_graph=True:   grad_norm requires_grad =", grad_norm.requires_grad)
print("  -> gradients differ from the plain loss's:", any(not torch.allclose(penalised[n], plain[n]) for n in plain))

params = {n: p.detach() for n, p in model.named_parameters()}


def loss_of(params):
    return loss_fn(torch.func.functional_call(model, params, (X,)), Y)


def total_of(params):
    grads = torch.func.grad(loss_of)(params)
    return loss_of(params) + torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))


reference = torch.func.grad(total_of)(params)
agree = all(torch.allclose(reference[n], penalised[n], atol=1e-6) for n in params)
print("  -> equal to torch.func.grad of (loss + ||grad loss||):", agree)
assert agree and grad_norm.requires_grad

# %% [markdown]
# The recipe above adds the penalty with weight 1. In practice the penalty has a weight $\lambda$, a hyperparameter:
# the penalty pulls towards flat regions, the data loss towards a good fit, and a large $\lambda$ wins. Below, 200
# steps of Adam (section 1.5) for $\lambda = 0$ (no penalty), $0.1$ and $1$: the larger $\lambda$, the worse the fit
# on this small regression problem.


# %%
def train_with_penalty(lam: float, steps: int = 200) -> dict[str, list[float]]:
    """Train with loss + lam * ||d loss / d params||; return the MSE and the gradient norm per step."""
    seed_everything(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    history = {"mse": [], "grad_norm": []}
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(X), Y)
        grad_params = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in grad_params))
        (loss + lam * grad_norm).backward()
        optimizer.step()
        history["mse"].append(loss.item())
        history["grad_norm"].append(grad_norm.item())
    return history


runs = {lam: train_with_penalty(lam) for lam in (0.0, 0.1, 1.0)}
for lam, hist in runs.items():
    # the final MSE is stable to two decimals; the final gradient norm is not (Adam makes it jitter
    # between about 0.02 and 0.06 from one step to the next), so only its bound is printed
    print(
        f"lambda={lam:<4} MSE {hist['mse'][0]:.2f} -> {hist['mse'][-1]:.2f}"
        f"   gradient norm {hist['grad_norm'][0]:.2f} -> below 0.1"
    )
final_mse = [hist["mse"][-1] for hist in runs.values()]
assert final_mse[0] < final_mse[1] < final_mse[2]
assert all(max(hist["grad_norm"][-20:]) < 0.1 < hist["grad_norm"][0] for hist in runs.values())
plot_curves(
    {f"MSE, lambda={lam}": hist["mse"] for lam, hist in runs.items()},
    xlabel="step",
    ylabel="MSE (data loss only)",
    title="training with a gradient penalty",
    logy=True,
)
plt.show()

# %% [markdown]
# ## 10. Freezing parameters (冻结参数)
#
# A parameter with `requires_grad=False` is a **frozen parameter** (冻结参数): autograd does not compute its gradient,
# and it does not even record the operations that involve only frozen parameters and data. The classic use is
# **fine-tuning** (微调): reuse a network trained on one task for another, keep most of it fixed, and train a new last
# layer.
#
# Our example is ResNet-18, torchvision's 18-layer image classifier, built from convolutions and BatchNorm layers
# (notebook 04 builds and trains a smaller network of the same kind). Its last layer `fc` is an `nn.Linear(512, 1000)`
# for 1000 classes. We freeze everything, then replace `fc` by a fresh `nn.Linear(512, 10)` for 10 classes (new
# parameters require gradients by default).
#
# Older code loads it with `resnet18(pretrained=True)`. `pretrained` is deprecated since torchvision 0.13; the modern
# call is `resnet18(weights=ResNet18_Weights.DEFAULT)`. We use `weights=None` (random weights) so that nothing is
# downloaded: freezing works the same.
#
# We count the graph nodes behind the output (by following `grad_fn.next_functions`, the links section 4 used): the
# unfrozen model records every convolution and batch norm, the frozen one only the final linear layer.


# %%
def count_graph_nodes(t: torch.Tensor) -> int:
    """Number of distinct backward nodes reachable from t.grad_fn."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return len(seen)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torchvision.models.resnet18(pretrained=False)  # the old argument, only to see the warning
messages = [str(w.message) for w in caught]
print("resnet18(pretrained=False) warns:", messages[0])
assert any("'pretrained' is deprecated" in m for m in messages)

seed_everything(0)
model = torchvision.models.resnet18(weights=None).to(device)
images = torch.randn(2, 3, 64, 64, device=device)
nodes_full = count_graph_nodes(model(images))

for param in model.parameters():
    param.requires_grad = False  # freeze all
model.fc = nn.Linear(512, 10).to(device)  # new head: trainable

n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
n_total = sum(p.numel() for p in model.parameters())
out = model(images)
nodes_frozen = count_graph_nodes(out)
print(f"trainable parameters: {n_train} of {n_total}")
print(f"graph nodes behind the output: unfrozen {nodes_full}, frozen backbone {nodes_frozen}")
assert n_train == 512 * 10 + 10
assert nodes_frozen < 10 and nodes_full > 100

# %% [markdown]
# After `backward()`, only the head has gradients. The loss is `F.cross_entropy`, the standard loss for
# classification (notebook 04 explains it), with made-up labels. The optimizer may receive only the head's parameters
# or all of them: SGD skips parameters whose `.grad` is `None`, so the frozen weights stay exactly as they were either
# way. (`momentum=0.9` makes each SGD step add 0.9 times the previous step; it does not matter here.)

# %%
loss = F.cross_entropy(out, torch.tensor([1, 7], device=device))
loss.backward()
with_grad = [n for n, p in model.named_parameters() if p.grad is not None]
print("parameters with a .grad:", with_grad)
assert with_grad == ["fc.weight", "fc.bias"]

param_choices = {"model.fc.parameters()": model.fc.parameters, "model.parameters()": model.parameters}
for params_given, get_params in param_choices.items():
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(get_params(), lr=1e-2, momentum=0.9)
    optimizer.step()
    changed = sorted({n.split(".")[0] for n, p in model.named_parameters() if not torch.equal(p, before[n])})
    print(f"SGD({params_given:22}) step changed: {changed}")
    assert changed == ["fc"]

# %% [markdown]
# **Frozen is not the same as unchanged.** The check above compares *parameters*. A **BatchNorm** layer (批归一化)
# normalises each channel with the mean and variance of the current batch, and keeps running averages of them for
# later use: those running statistics are *buffers*, tensors a module keeps that are not parameters (notebook 10). A
# model has two modes: in train mode (`model.train()`, the default) every forward pass updates the running statistics,
# frozen or not; in eval mode (`model.eval()`) BatchNorm uses them and leaves them alone (notebook 04 trains with both
# modes). So a "frozen" backbone fine-tuned in train mode drifts away from its pretrained statistics. The fix is to put
# the frozen part in eval mode: `model.eval()` for a frozen backbone or, when the head has layers that need train mode,
# `model.train()` followed by `backbone.eval()` each epoch (`model.train()` switches every sub-module back).

# %%
bn = model.bn1  # the first BatchNorm of the frozen backbone
for mode in ("train", "eval"):
    getattr(model, mode)()
    before = bn.running_mean.clone()
    with torch.no_grad():
        model(images)
    moved = (bn.running_mean - before).abs().max().item()
    print(f"model.{mode}(): running_mean of bn1 changed by a frozen forward pass: {moved > 0}")
    assert (moved > 0) == (mode == "train")
assert not bn.weight.requires_grad  # its parameters are frozen all along
# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict a gradient, write a custom `Function`, then a stretch that combines this
# notebook with notebook 01's broadcasting. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and
# run it. The **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or
# *not attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a kernel
# restart, run its first cell and go on. `make progress` (without make, e.g. on Windows:
# `python tools/course.py progress`) lists which exercises of every notebook pass.

# %%
import torch
import torch.nn.functional as F

from utils.exercises import Checker

ex = Checker("02")

# %% [markdown]
# ### Exercise 1 · Predict a vector-Jacobian product, then an accumulation
#
# Why does `backward` take a `gradient` argument (`grad_variables` of `torch.autograd.backward` in old code)? Section 3 answered: for a
# non-scalar `y`, `backward(gradient=g)` computes the vector-Jacobian product $g^\top J$. Predict, on paper, what
# this code prints:
#
# ```python
# x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
# y = x * x.sum()                                      # every y_i depends on every x_j
# y.backward(gradient=torch.tensor([1.0, 0.0, -2.0]))
# print(x.grad.tolist())                               # first
# (x ** 2).sum().backward()                            # a second backward pass, no zeroing
# print(x.grad.tolist())                               # second
# ```
#
# Write $J_{ij} = \partial y_i / \partial x_j$ first (it has two terms), then `x.grad[j]` $= \sum_i g_i J_{ij}$.
# Section 4 tells what the second backward does to `x.grad`. (Running the code afterwards to see why is allowed;
# running it instead of thinking is allowed too, but teaches less.)

# %%
# ✏️ Exercise 1: replace ... with [first, second], two lists of three numbers, e.g. [[1, 2, 3], [4, 5, 6]]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · A numerically stable Softplus `Function`
#
# $\mathrm{softplus}(x) = \log(1 + e^x)$ is a smooth ReLU, and its derivative is $\sigma(x)$, the sigmoid.
# Written as it reads, it breaks in float32: $e^{x}$ overflows to `inf` above $x \approx 88.7$, so
# `torch.log(1 + torch.exp(x))` returns `inf` for $x = 100$ instead of 100. The identity
# $\log(1 + e^x) = \max(x, 0) + \log(1 + e^{-|x|})$ (`torch.log1p` for the last term) never exponentiates a
# positive number.
#
# Write `Softplus`, a `torch.autograd.Function` (section 6): `forward` computes the stable formula (not with
# `F.softplus`, the function you are writing, nor with a library function that is softplus under another name, such
# as `torch.logaddexp(x, 0)`) and saves what `backward` needs with `ctx.save_for_backward` (the input
# or the output, not an intermediate result: section 7 shows why); `backward` returns the gradient of the input by the
# chain rule, written by you, without asking autograd. Write `backward` with PyTorch operations, so that it can itself
# be differentiated: the check runs `gradcheck` *and* `gradgradcheck` (section 7) in float64, and compares with
# `F.softplus` in float32 from $x = -100$ to $100$.


# %%
# ✏️ Exercise 2: write forward and backward
class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("your code here")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("your code here")


# %%
ex.check(2, Softplus)

# %% [markdown]
# ### Exercise 3 · The backward of a linear layer, for any batch shape (stretch)
#
# `F.linear(x, weight, bias)` computes `x @ weight.T + bias` for `x` of shape `(..., in)`: any number of leading
# dimensions (a batch, a batch of sequences, ...), `weight` of shape `(out, in)`, `bias` of shape `(out,)`.
# The matrix product applies the same `weight` at every leading position, and `bias` is broadcast to all of them
# (notebook 01, section 7).
#
# Write `linear_backward(x, weight, bias, grad_out)`: given `grad_out` $= \partial L/\partial\,$output (shape
# `(..., out)`), return `(grad_x, grad_weight, grad_bias)`, each shaped like its tensor: what autograd computes.
# Section 6's `LinearFunction` does it for a 2-D `x`; the new part is the rule behind broadcasting's backward: a
# tensor used at many positions receives the **sum** of the gradients from all of them. Write it with tensor
# operations, as in a custom `Function`'s backward: no `backward()`, `torch.autograd.grad` or `torch.func`. The
# check calls your function under `torch.no_grad()`, on 2-D, 3-D and 4-D inputs.


# %%
# ✏️ Exercise 3: write the body of the function
def linear_backward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, grad_out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(3, linear_backward)

# %% [markdown]
# ## Summary
#
# * One model written five times (NumPy, tensors, autograd, `nn`, `optim`) gives one loss curve: autograd replaces
#   the hand-written backward pass, `nn` layers replace the weight matrices and formulas, an optimizer replaces the
#   update. Every training loop is `zero_grad()` → `backward()` → `step()`.
# * `y.backward()` on a scalar fills `.grad` of the leaves (叶子节点). On a non-scalar it needs `gradient=g` and
#   computes the vector–Jacobian product $g^\top J$, equal to `(y * g).sum().backward()`; `torch.func.jacrev` shows
#   the Jacobian that is never built. Forward mode (`torch.func.jvp`, `jacfwd`) computes $Ju$ instead: $n$ passes
#   for $n$ inputs against $m$ reverse passes for $m$ outputs, so reverse mode wins for a scalar loss.
# * `torch.autograd.grad` returns gradients instead of accumulating them; with `create_graph=True` they can be
#   differentiated again (second derivatives, gradient penalties), and `retain_graph` then defaults to `True`.
#   Several outputs are summed; `allow_unused=True` accepts inputs the output does not use.
# * Within one backward pass the engine sums the gradients reaching a tensor along several paths (the chain rule's
#   sum) in its input buffer, then runs `AccumulateGrad` once. The graph's saved values are freed after a backward
#   pass (`retain_graph=True` keeps them), and `.grad` accumulates *across* passes: zero it each step
#   (`zero_grad()` sets `None`), or use accumulation on purpose for micro-batches.
# * For SGD on $(x-1)^2$ the distance to the minimum shrinks by $|1-2\eta|$ per step: the learning rate decides
#   between crawling, converging, zig-zagging and diverging.
# * `Variable` is gone (every tensor has `requires_grad`); prefer `.detach()` to `.data`, whose edits escape the
#   version counter.
# * A custom `Function` has `forward`/`backward` static methods, saves tensors with `save_for_backward` and other
#   values on `ctx`, returns one gradient per input (`None` for non-tensors), and can skip work with
#   `ctx.needs_input_grad`. For `torch.func` it needs the `setup_context` style, a vmap rule
#   (`generate_vmap_rule = True`) for `vmap`, and a `jvp` method (with `ctx.save_for_forward`) for `jvp`/`jacfwd`.
#   Always verify it with `gradcheck` and `gradgradcheck` in float64.
# * Double backward through a custom Function fails in two quiet ways: `@once_differentiable` (meant for backwards
#   written outside autograd) can make `autograd.grad` drop a second-order term, and intermediates saved in `forward`
#   are constants for autograd. Save inputs or outputs, or return the intermediates as outputs.
# * Freezing (`requires_grad=False`) removes parameters from the graph: no gradient, no update. BatchNorm's running
#   statistics are buffers and still change in train mode: put a frozen backbone in `eval()`.
#
# Next: **03 · dynamic graphs and hooks**, the graph itself and how to watch and change gradients as they flow.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This course was written from a teacher's study notes (in Chinese, for PyTorch 1.x), which learners do not need.
# For readers who know them, here is where the notes differ from PyTorch 2.14, and where this notebook shows what
# holds today.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | In the autograd version of the two-layer network, "`loss` is a tensor of shape `(1,)`, so use `loss.item()`" | A sum is a 0-dimensional tensor, shape `torch.Size([])`; `.item()` is still how to get the number | §1.3 · Autograd |
# | The same example suggests updating `weight.data` with `weight.grad.data` as an alternative to `torch.no_grad()` | Edits made through `.data` escape autograd's version counter and can silently corrupt gradients: update inside `torch.no_grad()` | §1.3 · Autograd; §2 · Why not `.data`? |
# | Tensors are wrapped in `Variable(...)` to be differentiated, and optimizer parameters "should be `Variable`s" | `Variable` and `Tensor` merged in PyTorch 0.4; `Variable(t)` returns a plain tensor: use `requires_grad=True` or `requires_grad_()` | §2 · `backward()` on a scalar |
# | Derivatives are printed with `dy_dx.data` | Use `.item()` for a number, `.detach()` for a tensor | §2 · `torch.autograd.grad` |
# | The vector example calls `c.backward` twice on one graph, with `gradient=[1, 1]` then `[1, 2]`, and prints `[2, 12]` and `[1, 2]` | The second call raises, because the first freed the graph; with `retain_graph=True` the gradients would add up to `[4, 18]`; `[2, 12]` and `[1, 2]` are what a fresh graph gives | §3 · `backward()` on a non-scalar |
# | The further reading asks why `backward` has a `grad_variables` argument | The argument is `gradient` in `Tensor.backward`, which never accepted `grad_variables`; `grad_variables` was the keyword of `torch.autograd.backward`, now `grad_tensors`, and the old name warns there | §3 · `backward()` on a non-scalar |
# | `loss.backward()` assigns gradients to `y1.grad` and `y2.grad`, and `x.grad` adds up the gradients it receives along each path | Non-leaf tensors keep no `.grad` unless `retain_grad()` is called (taught in notebook 03); the engine sums the paths' contributions in the node's input buffer and runs `AccumulateGrad` once with the sum; `.grad` adds up only across backward calls | §4 · The graph is freed; gradients accumulate |
# | The `MyReLU` example computes `Y_hat - Y` with shapes `(2, 1)` and `(1, 2)` and prints gradients `4.5` | The difference broadcasts to `2×2`, comparing each prediction with both targets; the `4.5` come from that | §6 · `MyReLU` |
# | The convolution Function names the weight gradient `grad_input` | It is the gradient of the weight (`grad_weight`) | §7 · A 2-D convolution as a Function |
# | "Use `@once_differentiable` by default unless we intend to double backward" | Use it only for a backward autograd cannot follow; a backward made of PyTorch operations is twice differentiable without it, and with the decorator `autograd.grad` can silently drop a second-order term | §7 · `once_differentiable`; §7 · A 2-D convolution as a Function |
# | The quoted source runs the engine as `Variable._execution_engine.run_backward` | It is `_engine_run_backward`, with the same `accumulate_grad` flags | §8 · `backward` versus `autograd.grad` |
# | The quoted `autograd.grad` has an `only_inputs` argument | It is ignored (the quoted code already warns so); `only_inputs=False` gives a `FutureWarning` in 2.14 | §8 · `allow_unused` |
# | The gradient-penalty recipe says `create_grad=True` | The argument is `create_graph=True` | §9 · Gradient penalty |
# | `torchvision.models.resnet18(pretrained=True)` | `pretrained` is deprecated since torchvision 0.13: `resnet18(weights=ResNet18_Weights.DEFAULT)` | §10 · Freezing parameters |
