# %% [markdown]
# # 10 · Modules and optimizers (模块与优化器)
#
# Every training loop leans on two objects: the model, an `nn.Module`, and the optimizer that updates it. This
# lesson opens both. Each claim is checked by a cell: counted, compared with a hand-written version, or asserted.
#
# **You will learn to**
#
# 1. say where a module keeps its **parameters**, **buffers** and sub-modules, why a layer kept in a Python list is
#    invisible, what sharing a layer does, and how to count parameters and FLOPs; initialise a model by walking
#    its modules; write layers with and without parameters; tell a layer from its function (`nn.Dropout` against
#    `F.dropout`); write LayerNorm by hand; load a checkpoint whose keys were renamed (section 1);
# 2. write **SGD with momentum**, **Nesterov** and **Adam** by hand and match `torch.optim` step for step; tell L2
#    regularisation from AdamW's **decoupled weight decay**; read `optimizer.state`; add a parameter group while
#    training; build parameter groups; run L-BFGS with a closure (section 2);
# 3. schedule the learning rate (warm-up, cosine, one-cycle, a plateau traced step by step) and measure what
#    annealing buys on a small run (section 3);
# 4. average weights (SWA and EMA), clip gradients, and know when gradient accumulation equals the big batch,
#    when it does not, and the fix for each case (section 4).
#
# **Prerequisites:** notebooks 01–04 (tensors, autograd, a training loop); notebook 06 §1 for `state_dict`. Used
# here and taught in full elsewhere: `clone` and `detach` ([notebook 01](01_tensors.ipynb), §9), freezing
# parameters ([notebook 02](02_autograd.ipynb), §10), `no_grad` versus `eval()`
# ([notebook 03](03_dynamic_graphs_and_hooks.ipynb), §6), `backward(gradient)`
# ([notebook 03](03_dynamic_graphs_and_hooks.ipynb), §7).
#
# **Study time:** about 185 min (45 of them for the exercises). The cells run in well under a minute.
#
# **On a GPU:** the cell of section 2.1 moves its layer to the GPU; everything else runs on the CPU on purpose
# (the lesson is about bookkeeping and arithmetic, not speed). The stored outputs were made on the CPU.
#
# This lesson grew out of a teacher's study notes written for PyTorch 1.x. You do not need them: where they differ
# from PyTorch 2.14, the closing section lists it.

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
# The course's `utils` package gives four helpers used since notebook 01: `seed_everything(0)` seeds Python, NumPy
# and torch; `get_device()` picks CUDA, then Apple's MPS, then the CPU; `fmt(x, d)` formats a tensor or number with
# `d` decimals, so that printed values are stable across machines; `show(t, name)` prints a tensor's name, shape,
# dtype and device, then its values rounded to 4 decimals.

# %%
import copy
import inspect
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from utils import fmt, get_device, seed_everything, show

seed_everything(0)
device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type)

# %% [markdown]
# ## 1. `nn.Module` from the inside
#
# ### 1.1 Where a module keeps its state
#
# `nn.Module.__init__` creates a few dictionaries, and `nn.Module.__setattr__` sorts every attribute you assign
# into one of them by its type:
#
# | you write in `__init__` | it lands in | returned by | in `state_dict()` | converted by `.to()` |
# |---|---|---|---|---|
# | `self.fc = nn.Linear(...)`: a **sub-module** (子模块) | `_modules` | `children()`, `modules()` | its own entries | yes |
# | `self.w = nn.Parameter(...)` | `_parameters` | `parameters()` | yes | yes |
# | `self.register_buffer("b", t)` | `_buffers` | `buffers()` | yes | yes |
# | `self.register_buffer("b", t, persistent=False)` | `_buffers` | `buffers()` | **no** | yes |
# | `self.t = torch.zeros(2)` (plain tensor) | the instance `__dict__` | nothing | no | **no** |
#
# A **parameter** (参数) is a tensor the optimizer trains. A **buffer** (缓冲区) is state that belongs to the model
# but is not learned by gradient descent, such as BatchNorm's running mean. The `training` flag is plain state too:
# `train()` and `eval()` set it on every sub-module.


# %%
class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)  # sub-module
        self.scale = nn.Parameter(torch.ones(2))  # learnable parameter
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # saved, not learned
        self.register_buffer("cache", torch.zeros(2), persistent=False)  # not saved either
        self.note = torch.zeros(2)  # a plain attribute: the module does not know it

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.scale


m = Scaler()
print("_modules    :", list(m._modules))
print("_parameters :", list(m._parameters))
print("_buffers    :", list(m._buffers))
print("training    :", m.training)
print("named_parameters():", [name for name, _ in m.named_parameters()])
print("named_buffers()   :", [name for name, _ in m.named_buffers()])
print("state_dict()      :", list(m.state_dict()))
m(torch.ones(4, 3))
m(torch.ones(4, 3))
m.to(torch.float64)
print(
    "after two calls and .to(float64): calls =",
    m.calls.item(),
    "| dtypes:",
    m.scale.dtype,
    m.cache.dtype,
    m.calls.dtype,
    "| plain attribute:",
    m.note.dtype,
)
assert m.note.dtype == torch.float32 and m.cache.dtype == torch.float64 and m.calls.dtype == torch.long

# %% [markdown]
# `.to(dtype)` converts only floating-point parameters and buffers (the integer counter stays `int64`), and never
# plain attributes: a tensor stored as `self.note` would also stay on the CPU after `model.to("cuda")`. Use
# `register_buffer` for every tensor the model needs.
#
# Three more facts about this bookkeeping:
#
# * `self.w = nn.Parameter(t)` is shorthand: `__setattr__` calls `self.register_parameter("w", ...)`, which you
#   can call yourself when the name is computed. It refuses a plain tensor: a parameter must be an `nn.Parameter`.
# * The three dictionaries are plain `dict`s in PyTorch 2.x (ordered, like every `dict` since Python 3.7); the
#   hook registries (`_forward_hooks` and its siblings, [notebook 03](03_dynamic_graphs_and_hooks.ipynb), §9) are
#   still `OrderedDict`s. Names with a leading underscore are private: read them to understand, but use
#   `named_parameters()`, `named_buffers()` and `named_children()` in code.
# * BatchNorm's statistics are buffers named `running_mean` and `running_var` (a variance, not a standard
#   deviation), plus a counter `num_batches_tracked`.

# %%
m.register_parameter("offset", nn.Parameter(torch.zeros(2, dtype=torch.float64)))
print("after register_parameter:", [name for name, _ in m.named_parameters()])
try:
    m.register_parameter("bad", torch.zeros(2))
except TypeError as err:
    print(f"{type(err).__name__}: {err}")
print(
    "dict types:",
    type(m._parameters).__name__,
    type(m._buffers).__name__,
    type(m._modules).__name__,
    "| hook registry:",
    type(m._forward_hooks).__name__,
)
print("BatchNorm1d buffers:", [name for name, _ in nn.BatchNorm1d(4).named_buffers()])
assert "offset" in dict(m.named_parameters()) and type(m._parameters) is dict

# %% [markdown]
# ### 1.2 `ModuleList` and `Sequential` versus a Python list
#
# Layers kept in a plain Python `list` are not part of the model. The reason is the table above, not Python's
# scoping: `__setattr__` sees a `list`, not a `Module`, so nothing is registered. The forward pass still works,
# which is what makes this bug silent: the optimizer, `state_dict()` and `.to()` never see those parameters.
# `nn.ModuleList` (a list that registers) and `nn.Sequential` (which also defines `forward` as "call each layer in
# order") fix it; `nn.ParameterList` and `nn.ParameterDict` do the same for bare parameters.


# %%
class Blocks(nn.Module):
    def __init__(self, container):
        super().__init__()
        self.blocks = container([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


for container in (list, nn.ModuleList):
    net = Blocks(container)
    n_params = sum(p.numel() for p in net.parameters())
    out = net(torch.ones(1, 4))
    print(
        f"{container.__name__:10} forward works: {tuple(out.shape)}  parameters: {n_params:2}  "
        f"state_dict keys: {len(net.state_dict())}"
    )
try:
    torch.optim.SGD(Blocks(list).parameters(), lr=0.1)
except ValueError as err:
    print(f"optimizer on the list version -> {type(err).__name__}: {err}")
seq = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)])
print("nn.Sequential keys:", list(seq.state_dict())[:2], "...", "| seq[1] is", seq[1])
plist = nn.ParameterList([nn.Parameter(torch.zeros(2)) for _ in range(3)])
print("nn.ParameterList keys:", list(plist.state_dict()))
assert sum(p.numel() for p in Blocks(list).parameters()) == 0
assert sum(p.numel() for p in Blocks(nn.ModuleList).parameters()) == 3 * (16 + 4)

# %% [markdown]
# ### 1.3 Sharing a layer: one module, called twice
#
# `ModuleList` only registers layers; `forward` decides the order in which they run, and how often. A module
# called twice is **one** set of parameters used twice, **parameter sharing** (参数共享): its gradient is the sum
# of the gradients of both uses, just as a tensor used twice gets the sum ([notebook 02](02_autograd.ipynb), §4).
# A **weight tie** (权重绑定) goes one step further: two modules hold the *same* `Parameter`, as language models do
# with their input embedding and output projection (`nn.Embedding(n, d)` is a lookup table of `n` learned vectors of
# size `d`, its `weight` of shape `(n, d)`; notebook 05 uses it for words). `parameters()` yields a shared tensor
# once, so counts and the optimizer see it once; `state_dict()` keeps one key per place it is stored.
# `torch.testing.assert_close` (notebook 01) checks the gradients within float32 rounding, here and throughout the
# lesson.

# %%
seed_everything(0)
layer = nn.Linear(3, 3)
twice = nn.Sequential(layer, nn.Tanh(), layer)  # the same object at positions 0 and 2
x = torch.randn(5, 3)
twice(x).sum().backward()
shared_grad = layer.weight.grad.clone()

# the same computation with two separate copies of the weights: their gradients add up to the shared one
first, second = copy.deepcopy(layer), copy.deepcopy(layer)
second(torch.tanh(first(x))).sum().backward()
torch.testing.assert_close(shared_grad, first.weight.grad + second.weight.grad)
print(
    "called twice: parameter tensors",
    len(list(twice.parameters())),
    "| state_dict keys",
    list(twice.state_dict()),
    "| gradient = sum of both uses",
)

embedding = nn.Embedding(10, 4)
output = nn.Linear(4, 10, bias=False)
output.weight = embedding.weight  # tie: one Parameter, two owners
tied = nn.ModuleDict({"embedding": embedding, "output": output})
print(
    "tied: named_parameters()", [name for name, _ in tied.named_parameters()], "| state_dict", list(tied.state_dict())
)
assert sum(p.numel() for p in tied.parameters()) == 40 and len(tied.state_dict()) == 2

# %% [markdown]
# `copy.deepcopy` (Python's standard deep copy) makes an independent module with equal weights; this lesson uses
# it wherever two models must start from the same numbers. `nn.ModuleDict` is the dictionary twin of `ModuleList`.
#
# ### 1.4 Counting parameters and FLOPs
#
# A parameter count is `sum(p.numel() for p in model.parameters())`; counting only the trainable ones and freezing
# are taught in [notebook 02](02_autograd.ipynb), §10. Two traps:
#
# * `model.parameters()` returns a **generator** (生成器), which can be consumed once. Counting with it and then
#   handing the same generator to an optimizer gives the optimizer nothing. Call `parameters()` again, or make a
#   `list`.
# * A layer created in `__init__` but never called in `forward` is still allocated, initialised, counted and
#   saved; it just never gets a gradient. Do not create layers you do not use.
#
# Counting the **floating-point operations** (浮点运算数, FLOPs) of a forward pass is a job for
# `torch.utils.flop_counter.FlopCounterMode`: inside its `with` block it records every matrix product and
# convolution that runs and adds up their FLOPs (a multiply and an add count as two). For a `Linear(i, o)` on a
# batch of `n` rows that is `2·n·i·o`. The backward pass of a layer costs about twice its forward: one product for
# the input's gradient and one for the weight's. The first layer skips the input's gradient, since the data needs
# none, and here that layer does 10/11 of the work (100·50 against 50·10 multiplications per row), so the whole
# backward pass costs barely more than the forward: 384,000 against 352,000 FLOPs.

# %%
from torch.utils.flop_counter import FlopCounterMode


class WithSpare(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(100, 50)
        self.out = nn.Linear(50, 10)
        self.spare = nn.Linear(50, 50)  # created, never called

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


seed_everything(0)
model = WithSpare()
params = model.parameters()  # a generator
print("parameters:", sum(p.numel() for p in params))
try:
    torch.optim.SGD(params, lr=0.1)  # the generator is used up
except ValueError as err:
    print(f"the same generator, again -> {type(err).__name__}: {err}")

x = torch.randn(32, 100)
with FlopCounterMode(display=False) as forward_count:
    loss = model(x).sum()
with FlopCounterMode(display=False) as backward_count:
    loss.backward()
by_formula = 2 * 32 * (100 * 50 + 50 * 10)
print(f"forward FLOPs {forward_count.get_total_flops():,} (2·n·i·o summed: {by_formula:,})")
print(f"backward FLOPs {backward_count.get_total_flops():,} (no input gradient for the first layer)")
print(
    "the spare layer: counted", model.spare.weight.numel() + model.spare.bias.numel(), "| grad", model.spare.weight.grad
)
assert forward_count.get_total_flops() == by_formula
assert backward_count.get_total_flops() == 2 * 32 * (100 * 50) + 2 * (2 * 32 * 50 * 10)
assert model.spare.weight.grad is None

# %% [markdown]
# Some model code defines its own `flops()` method; that is the model's code, not a PyTorch API. `FlopCounterMode`
# works on any model, and `get_flop_counts()` breaks the total down by module and operator.
#
# ### 1.5 Initialisation by walking `modules()`
#
# `model.modules()` yields every module recursively (the model itself first), and `named_modules()` yields `(name,
# module)` pairs with dotted names. A common **initialisation** (初始化) loop uses **Kaiming (He) initialisation**
# (Kaiming 初始化) for convolutions followed by ReLU: weights drawn from a normal distribution with standard deviation
# $\sqrt{2/\text{fan}}$, where `mode="fan_out"` uses fan = out_channels × kernel area. `model.apply(fn)` is the same
# walk written as a callback. We check the measured standard deviation against the formula.
#
# Without such a loop every layer keeps its own default, set by its `reset_parameters()` method when it is built:
# `nn.Linear(i, o)` and `nn.Conv2d` draw weights and biases uniformly from $[-1/\sqrt{\text{fan\_in}},
# 1/\sqrt{\text{fan\_in}}]$ (written in the source as `kaiming_uniform_(weight, a=math.sqrt(5))`).


# %%
def init_weights(model):
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.BatchNorm2d):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)


seed_everything(0)
default = nn.Linear(400, 30)
print(
    f"default nn.Linear(400, 30): max |weight| {default.weight.abs().max():.4f}, "
    f"bound 1/sqrt(400) = {1 / math.sqrt(400):.4f}"
)
assert default.weight.abs().max() <= 1 / math.sqrt(400) and default.bias.abs().max() <= 1 / math.sqrt(400)

cnn = nn.Sequential(
    nn.Sequential(nn.Conv2d(16, 64, 3), nn.BatchNorm2d(64), nn.ReLU()),
    nn.Sequential(nn.Conv2d(64, 128, 3), nn.BatchNorm2d(128), nn.ReLU()),
    nn.Flatten(),
    nn.Linear(128 * 4 * 4, 10),  # for 8x8 inputs
)
init_weights(cnn)
for name, layer in cnn.named_modules():
    if isinstance(layer, nn.Conv2d):
        fan_out = layer.out_channels * layer.kernel_size[0] * layer.kernel_size[1]
        expected = math.sqrt(2 / fan_out)
        measured = layer.weight.std().item()
        print(f"{name:4} fan_out={fan_out:5}  std measured {measured:.3f}  expected {expected:.3f}")
        assert abs(measured / expected - 1) < 0.03
print("first names from named_modules():", [name for name, _ in cnn.named_modules()][:4])

# %% [markdown]
# A recipe seen in older code copies the convolutions into another model with `conv_model.add_module(name, layer)`
# for each `(name, layer)` of `named_modules()`. That fails on any nested model: names such as `"0.0"` contain a
# dot, and `add_module` refuses dots (they would be ambiguous in `state_dict` keys). Replace the dots or keep the
# structure.

# %%
conv_model = nn.Sequential()
try:
    for name, layer in cnn.named_modules():
        if isinstance(layer, nn.Conv2d):
            conv_model.add_module(name, layer)
except KeyError as err:
    print(f"{type(err).__name__}: {err}")
for name, layer in cnn.named_modules():
    if isinstance(layer, nn.Conv2d):
        conv_model.add_module(name.replace(".", "_"), layer)
print(conv_model)
assert len(conv_model) == 2

# %% [markdown]
# ### 1.6 Custom layers, with and without parameters
#
# A layer without parameters only needs `forward`. `Norm` standardises its input with `x.std()`, which divides by
# n − 1 inside the square root, **Bessel's correction** (贝塞尔校正; section 1.9 says what it does and does not
# make unbiased). For 0, 1, …, 10 the variance is 110 / 10 = 11, so the last value is 5/√11 = 1.5076.


# %%
class Norm(nn.Module):  # a layer without parameters
    def forward(self, x):
        return (x - x.mean()) / x.std()


y = Norm()(torch.arange(11.0))
show(y, "Norm()(torch.arange(11.))")
assert list(Norm().parameters()) == []
assert math.isclose(y[-1].item(), 5 / math.sqrt(11), rel_tol=1e-6)

# %% [markdown]
# A layer with parameters declares them as `nn.Parameter` (or as sub-modules) in `__init__`. `TwoLayerNet` is
# adapted from the custom-module example of the official tutorial "Learning PyTorch with Examples", written here with
# raw weight matrices. It is trained with a sum-of-squares loss and plain SGD at learning rate 1e-4 for 500 steps.
#
# The same network can be built from `nn.Linear`. Mind the layout: `nn.Linear` stores `weight` as
# **(out_features, in_features)** and computes `x @ weight.T + bias`, while `TwoLayerNet` stores (in, out) and
# computes `x @ weight1`. Copying the transposed weights gives the same function.


# %%
class TwoLayerNet(nn.Module):
    def __init__(self, d_in, h, d_out):
        super().__init__()
        self.weight1 = nn.Parameter(torch.randn(d_in, h) / 25)
        self.bias1 = nn.Parameter(torch.randn(1, h) / 25)
        self.weight2 = nn.Parameter(torch.randn(h, d_out) / 25)
        self.bias2 = nn.Parameter(torch.randn(1, d_out) / 25)

    def forward(self, x):
        h_relu = (x @ self.weight1 + self.bias1).clamp(min=0)
        return h_relu @ self.weight2 + self.bias2


seed_everything(0)
N, D_in, H, D_out = 64, 1000, 100, 10
x, y = torch.randn(N, D_in), torch.randn(N, D_out)
model = TwoLayerNet(D_in, H, D_out)
for name, param in model.named_parameters():
    print(f"{name:8} {tuple(param.shape)}")
criterion = nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
losses = []
for t in range(500):
    loss = criterion(model(x), y)
    losses.append(loss.item())
    if t % 100 == 0:
        print(f"step {t:3}: loss {loss.item():.2e}")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"after 500 steps the loss is below a millionth of the first: {losses[-1] < 1e-6 * losses[0]}")
assert losses[-1] < 1e-6 * losses[0]

as_layers = nn.Sequential(nn.Linear(D_in, H), nn.ReLU(), nn.Linear(H, D_out))
with torch.no_grad():
    as_layers[0].weight.copy_(model.weight1.T)
    as_layers[0].bias.copy_(model.bias1.squeeze(0))
    as_layers[2].weight.copy_(model.weight2.T)
    as_layers[2].bias.copy_(model.bias2.squeeze(0))
torch.testing.assert_close(as_layers(x), model(x))
print("nn.Linear weight shape:", tuple(as_layers[0].weight.shape), "-> same outputs as TwoLayerNet")

# %% [markdown]
# ### 1.7 `train()` and `eval()`: Dropout
#
# A module starts in training mode; switch explicitly with `model.train()` and `model.eval()` rather than rely on
# it. **Dropout** (丢弃法) behaves differently in the two modes. In training it zeroes each element with
# probability `p` and multiplies the survivors by 1/(1 − p), so the expected value of every element is unchanged
# (**inverted dropout** (倒置丢弃)); in evaluation it returns the input unchanged. With p = 0.3 the survivors of
# `[1, 2, 3, 4, 5]` become `x / 0.7`: 1.4286, 2.8571, 4.2857, 5.7143, 7.1429 (which ones survive is random).
#
# `eval()` is not `torch.no_grad()`: `eval()` changes what **layers** do (Dropout, BatchNorm), `no_grad` changes
# what **autograd** records, and validation needs both
# ([notebook 03](03_dynamic_graphs_and_hooks.ipynb), §6; [notebook 04](04_mnist_cnn.ipynb), §13).

# %%
drop = nn.Sequential(nn.Dropout(0.3))
x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
show(x / 0.7, "x / 0.7")
drop.train()
seed_everything(0)
out = drop(x)
show(out, "train mode")
kept = out != 0
torch.testing.assert_close(out[kept], x[kept] / 0.7)
drop.eval()
show(drop(x), "eval mode")
assert torch.equal(drop(x), x)
drop.train()
many = drop(torch.ones(200_000))
print(f"training mode over 200,000 ones: dropped {(many == 0).float().mean():.2f}, mean {many.mean():.2f}")
assert abs((many == 0).float().mean() - 0.3) < 0.01 and abs(many.mean() - 1) < 0.01
drop.eval()
assert all(not layer.training for layer in drop.modules())  # eval() reaches every sub-module

# %% [markdown]
# ### 1.8 Layers and functions: `nn.ReLU` calls `F.relu`
#
# Most layers have a function twin in `torch.nn.functional` (imported as `F`): `nn.Conv2d` and `F.conv2d`,
# `nn.ReLU` and `F.relu`, `nn.Dropout` and `F.dropout`. The layer **is** the function plus state: it owns the
# parameters (and the `training` flag) and passes them to the function in `forward`. Read the source with
# `inspect.getsource` (Python's standard library). So the choice is about bookkeeping, not speed: a function is
# fine for what has no state (`F.relu`), a layer is needed for what has parameters or depends on the mode.
#
# The classic mistake is `F.dropout(x, p)` inside `forward`: its `training` argument defaults to `True` and knows
# nothing of `model.eval()`, so the model keeps dropping at evaluation. Pass `training=self.training`, or use the
# layer.

# %%
for cls in (nn.ReLU, nn.Dropout):
    print(f"{cls.__name__}.forward:", inspect.getsource(cls.forward).strip().splitlines()[-1].strip())

seed_everything(0)
conv = nn.Conv2d(3, 4, 3)
image = torch.randn(1, 3, 8, 8)
torch.testing.assert_close(conv(image), F.conv2d(image, conv.weight, conv.bias))
print("nn.Conv2d(image) equals F.conv2d(image, conv.weight, conv.bias)")


class Buggy(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5)  # training=True by default


class Fixed(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=self.training)


seed_everything(0)
ones = torch.ones(8)
print("Buggy().eval():", fmt(Buggy().eval()(ones), 1))
print("Fixed().eval():", fmt(Fixed().eval()(ones), 1))
assert torch.equal(Fixed().eval()(ones), ones) and not torch.equal(Buggy().eval()(ones), ones)

# %% [markdown]
# ### 1.9 LayerNorm by hand, and biased versus unbiased variance
#
# `torch.var` and `torch.std` divide by n − 1 by default (`correction=1`). For the variance that gives the
# **unbiased estimate** (无偏估计): its average over many samples is the true variance. The square root of an
# unbiased variance is **not** an unbiased estimate of the standard deviation: the square root is concave, so on
# average it comes out low (Jensen's inequality). *(deeper: you can skip this on a first reading)* For samples of 3
# numbers from a standard normal distribution the mean of `std()` is √(2/2)·Γ(3/2)/Γ(1) ≈ 0.886, not 1, as the cell
# measures (Γ is the Gamma function, which extends the factorial, Γ(n) = (n − 1)!, to non-integers; `math.gamma`
# computes it). The older keyword for the
# correction, `unbiased=True`, names a property of the variance, not of the standard deviation.
#
# LayerNorm normalises with the **biased estimate** (有偏估计, divide by n). A hand-written LayerNorm that starts
# from `var()` must therefore rescale it by (C − 1)/C; the clearer spelling today is `var(correction=0)`
# (`correction` generalises the older `unbiased=` flag, which still works). NumPy's `np.var` is biased by default:
# another trap when porting code.

# %%
v = torch.arange(11.0)
print(
    f"torch var {v.var():.1f} (divides by n - 1) | var(correction=0) {v.var(correction=0):.1f} | numpy var "
    f"{np.var(v.numpy()):.1f} | std {v.std():.4f}"
)
assert math.isclose(v.var(), 11, rel_tol=1e-6) and math.isclose(v.var(correction=0), 10, rel_tol=1e-6)
assert math.isclose(np.var(v.numpy()), 10, rel_tol=1e-6)

seed_everything(0)
samples = torch.randn(200_000, 3)
mean_var, mean_std = samples.var(dim=1).mean().item(), samples.std(dim=1).mean().item()
expected_std = math.gamma(1.5) / math.gamma(1.0)
print(
    f"200,000 samples of 3: mean var() {mean_var:.2f} (true 1) | mean std() {mean_std:.2f} (theory {expected_std:.3f})"
)
assert abs(mean_var - 1) < 0.02 and abs(mean_std - expected_std) < 0.01

seed_everything(0)
B, C = 3, 4
x, weight, bias = torch.rand(B, C), torch.rand(C), torch.rand(C)
reference = F.layer_norm(x, (C,), weight, bias, eps=1e-5)
mean = x.mean(dim=1, keepdim=True)
rescaled = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) * (C - 1) / C + 1e-5) * weight + bias
modern_way = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True, correction=0) + 1e-5) * weight + bias
unbiased_way = (x - mean) / torch.sqrt(x.var(dim=1, keepdim=True) + 1e-5) * weight + bias
torch.testing.assert_close(rescaled, reference)
torch.testing.assert_close(modern_way, reference)
print(f"with the unbiased variance the result is off by up to {(unbiased_way - reference).abs().max():.3f}")
assert (unbiased_way - reference).abs().max() > 0.05

# the general case: normalise over the last two dimensions (C1, C2)
x4 = torch.rand(1, 2, 4, 3)
ln = nn.LayerNorm([4, 3])
dims = (-2, -1)
by_hand = (x4 - x4.mean(dims, keepdim=True)) / torch.sqrt(x4.var(dims, keepdim=True, correction=0) + ln.eps)
torch.testing.assert_close(ln(x4), by_hand * ln.weight + ln.bias)
print("nn.LayerNorm([4, 3]) equals the hand-written version over the last two dimensions")

# %% [markdown]
# ### 1.10 Hooks on `state_dict`: loading a checkpoint whose keys were renamed
#
# `state_dict()` and `load_state_dict()` run hooks, like `forward` does. The useful one is
# `register_load_state_dict_pre_hook(hook)`: before a module loads, `hook(module, state_dict, prefix, ...)` may
# edit the dictionary in place. A module that renamed an attribute (here `fc` became `proj`) can then still load
# checkpoints saved under the old name, with `strict=True`. `prefix` is the module's own place in the model
# (`"block."` below), so the hook works wherever the module is used. `register_state_dict_post_hook` is the
# counterpart for saving.


# %%
class Renamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)  # was `self.fc` in an older version
        self.register_load_state_dict_pre_hook(self._rename_old_keys)

    @staticmethod
    def _rename_old_keys(module, state_dict, prefix, *args):
        for key in [k for k in state_dict if k.startswith(prefix + "fc.")]:
            state_dict[prefix + "proj." + key.removeprefix(prefix + "fc.")] = state_dict.pop(key)

    def forward(self, x):
        return self.proj(x)


old_checkpoint = {"block.fc.weight": torch.eye(2), "block.fc.bias": torch.zeros(2)}
model = nn.Sequential()
model.add_module("block", Renamed())
result = model.load_state_dict(old_checkpoint, strict=True)
print("loaded old keys", list(old_checkpoint), "->", list(model.state_dict()), "|", result)
assert torch.equal(model.block.proj.weight, torch.eye(2))

# %% [markdown]
# ## 2. What an optimizer computes
#
# ### 2.1 The optimizer holds references: build it after moving the model
#
# An **optimizer** (优化器) is built from an iterable of tensors (`model.parameters()`, or a plain list such as
# `[w]`) and stores **references to those tensors**, not copies. `optimizer.step()` reads each tensor's `.grad` and
# updates the tensor in place; `optimizer.zero_grad()` clears the gradients. The order of a training step is
# `zero_grad()` → forward → `loss.backward()` → `step()` ([notebook 04](04_mnist_cnn.ipynb), §13). Older code wraps
# tensors in `torch.autograd.Variable`: that class was merged into `Tensor` in PyTorch 0.4, and `Variable(t)` now
# simply returns a tensor.
#
# Because it holds references, an optimizer must see the tensors the model will use. Today `module.to()` converts
# parameters in place (same Python objects), so most code survives building the optimizer first and moving the
# model afterwards. Conversions that create new parameter objects leave the optimizer updating orphans. The switch
# `torch.__future__.set_overwrite_module_params_on_conversion` makes `.to()` behave that way, and shows the
# failure: the model's gradients land on the new tensors, while the optimizer steps the old ones, which have no
# gradient. Building the optimizer last is always safe.

# %%
layer = nn.Linear(2, 1)
ids_before = [id(p) for p in layer.parameters()]
layer.to(torch.float64)
print("default .to(): same parameter objects:", [id(p) for p in layer.parameters()] == ids_before)

optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)  # built too early
torch.__future__.set_overwrite_module_params_on_conversion(True)
try:
    layer.to(device=device, dtype=torch.float32)  # creates new Parameter objects
finally:
    torch.__future__.set_overwrite_module_params_on_conversion(False)
before = layer.weight.detach().clone()
layer(torch.ones(1, 2, device=device)).sum().backward()
optimizer.step()
stale = optimizer.param_groups[0]["params"][0]
print(
    "optimizer holds the model's tensors:",
    stale is layer.weight,
    "| its tensor has a gradient:",
    stale.grad is not None,
    "| the model changed:",
    not torch.equal(before, layer.weight),
)
assert stale is not layer.weight and torch.equal(before, layer.weight)

# %% [markdown]
# ### 2.2 SGD, momentum and Nesterov, written by hand
#
# With gradient $g_t$ of the loss at step $t$, learning rate $\eta$ and weight decay $\lambda$, `torch.optim.SGD`
# computes:
#
# | | update |
# |---|---|
# | plain SGD | $d_t = g_t + \lambda w_{t-1}$, then $w_t = w_{t-1} - \eta\, d_t$ |
# | `momentum=μ` | $b_t = \mu\, b_{t-1} + d_t$ (with $b_1 = d_1$), then $w_t = w_{t-1} - \eta\, b_t$ |
# | `nesterov=True` | $b_t$ as above, then $w_t = w_{t-1} - \eta\,(d_t + \mu\, b_t)$ |
#
# The **momentum buffer** (动量缓冲区) $b$ is a running sum of past gradients, each weighted by $\mu$ per step of age: along
# a direction where the gradients agree it grows up to $1/(1-\mu)$ = 10 times one gradient, and where they alternate in
# sign it cancels. Nesterov steps with $d_t + \mu b_t = (1+\mu)\, d_t + \mu^2 b_{t-1}$: the newest gradient counts
# more, so a change of direction shows up sooner, which damps the overshoot. Two details differ from some textbooks:
# the first buffer is the gradient itself (not zero), and $\eta$ multiplies the buffer when it is used rather than
# being stored in it, so a new learning rate from a scheduler takes effect at once. (The `dampening` option, 0 by
# default, would scale $d_t$ by $1 - \text{dampening}$ inside the buffer.)
#
# The cell writes these rules with the closed-form gradient of a least-squares loss, $g = \tfrac{2}{N} X^\top (Xw -
# y)$, and checks every step against `torch.optim.SGD`, which gets its gradient from autograd. The problem is
# deliberately badly conditioned: the loss curves about 40 times more steeply along one direction than the other, which
# is where momentum matters. The figure draws the three paths over the loss's contour lines: `torch.meshgrid(a, b,
# indexing="xy")` returns the two coordinate grids of every pair `(a[j], b[i])`, and matplotlib's
# `ax.contour(X, Y, Z, levels=...)` draws the curves along which `Z` equals each level.

# %%
seed_everything(0)
X = torch.randn(64, 2) * torch.tensor([1.0, 5.0])  # the second feature is 5 times larger: a steep direction
y = X @ torch.tensor([1.0, -2.0]) + 0.1 * torch.randn(64)


def lsq_loss(w):
    return ((X @ w - y) ** 2).mean()


def lsq_grad(w):  # the gradient of lsq_loss, by hand
    return 2 * X.T @ (X @ w - y) / len(X)


def sgd_by_hand(w, steps, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
    path, buf = [w], None
    for _ in range(steps):
        d = lsq_grad(w) + weight_decay * w
        if momentum:
            buf = d.clone() if buf is None else momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        w = w - lr * d
        path.append(w)
    return path


def torch_path(make_optimizer, steps):
    w = torch.zeros(2, requires_grad=True)
    optimizer = make_optimizer([w])
    path = [w.detach().clone()]
    for _ in range(steps):
        optimizer.zero_grad()
        lsq_loss(w).backward()
        optimizer.step()
        path.append(w.detach().clone())
    return path


settings = {
    "plain": dict(),
    "momentum 0.9": dict(momentum=0.9),
    "Nesterov 0.9": dict(momentum=0.9, nesterov=True),
    "momentum + weight decay": dict(momentum=0.9, weight_decay=0.1),
}
paths = {}
for name, options in settings.items():
    mine = sgd_by_hand(torch.zeros(2), 60, lr=0.005, **options)
    theirs = torch_path(lambda params, options=options: torch.optim.SGD(params, lr=0.005, **options), 60)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b)
    paths[name] = torch.stack(theirs)
    print(f"{name:24} by hand == torch.optim.SGD for 60 steps | loss after 60 steps {lsq_loss(theirs[-1]):.4f}")
assert lsq_loss(paths["Nesterov 0.9"][-1]) < lsq_loss(paths["momentum 0.9"][-1]) < lsq_loss(paths["plain"][-1])

# contour lines of the loss over a grid of (w[0], w[1]) points
grid = torch.stack(torch.meshgrid(torch.linspace(-0.5, 2.0, 80), torch.linspace(-3.0, 0.5, 80), indexing="xy"), -1)
surface = ((grid @ X.T - y) ** 2).mean(-1)
fig, ax = plt.subplots(figsize=(6, 4.5))
ax.contour(grid[..., 0], grid[..., 1], surface, levels=[0.05, 0.3, 1, 3, 10, 30, 60], colors="lightgray")
for name in ("plain", "momentum 0.9", "Nesterov 0.9"):
    ax.plot(paths[name][:, 0], paths[name][:, 1], ".-", markersize=3, label=name)
ax.set(xlabel="w[0] (shallow direction)", ylabel="w[1] (steep direction)", title="60 SGD steps from (0, 0), lr 0.005")
ax.legend()
plt.show()

# %% [markdown]
# Plain SGD crawls along the shallow direction: its learning rate is limited by the steep one. Momentum builds
# speed along the shallow direction but overshoots across the steep one and zigzags; Nesterov's look-ahead damps the
# zigzag and gets closest to the minimum.
#
# ### 2.3 Adam, written by hand
#
# **Adam** (自适应矩估计) keeps two running averages per parameter element: of the gradient (its first **moment**
# (矩), `exp_avg`) and of its square (the second moment, `exp_avg_sq`), with decay rates $\beta_1$ and $\beta_2$
# (`betas`, by default 0.9 and 0.999):
#
# $$m_t = \beta_1 m_{t-1} + (1-\beta_1)\, g_t, \qquad v_t = \beta_2 v_{t-1} + (1-\beta_2)\, g_t^2,$$
# $$\hat m_t = \frac{m_t}{1-\beta_1^t}, \qquad \hat v_t = \frac{v_t}{1-\beta_2^t}, \qquad
#   w_t = w_{t-1} - \eta\, \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}.$$
#
# * **Bias correction** (偏差修正): $m$ and $v$ start at zero, so early on they are too small (at $t = 1$,
#   $m_1 = 0.1\, g_1$); dividing by $1 - \beta^t$ undoes exactly that, and fades out as $t$ grows.
# * **Per-element scale**: the step is $\hat m / \sqrt{\hat v}$, a ratio that does not depend on the gradient's
#   units. On the first step it is $g/|g| = \pm 1$: every element moves by about $\eta$, whether its gradient is
#   1000 or 0.001.
# * **Where $\epsilon$ goes**: it is added to $\sqrt{\hat v}$, *after* the square root and the bias correction.
#   It only matters for gradients near $\epsilon$ = 1e-8, where it shrinks the step; a version that adds it inside
#   the square root behaves differently there.
#
# The cell checks the formulas against `torch.optim.Adam` for 20 steps, then measures the first step for gradients
# of very different sizes.


# %%
def adam_by_hand(w, steps, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    beta1, beta2 = betas
    m, v, path = torch.zeros_like(w), torch.zeros_like(w), [w]
    for t in range(1, steps + 1):
        g = lsq_grad(w)
        if decoupled:  # AdamW (section 2.4)
            w = w * (1 - lr * weight_decay)
        else:  # Adam's weight_decay: an L2 term added to the gradient
            g = g + weight_decay * w
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        w = w - lr * m_hat / (v_hat.sqrt() + eps)
        path.append(w)
    return path


mine = adam_by_hand(torch.zeros(2), 20, lr=0.1)
theirs = torch_path(lambda params: torch.optim.Adam(params, lr=0.1), 20)
for a, b in zip(mine, theirs):
    torch.testing.assert_close(a, b)
print("Adam by hand == torch.optim.Adam for 20 steps | w after 20 steps:", fmt(theirs[-1], 3))

print("first Adam step (lr 0.1) for a gradient of size g:")
for g in (1e3, 1.0, 1e-3, 1e-8):
    p = nn.Parameter(torch.zeros(1))
    adam = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.full((1,), g)
    adam.step()
    eps_inside = g / math.sqrt(g * g + 1e-8)  # what the step / lr would be with eps inside the square root
    print(f"  g = {g:7.0e}: step / lr = {-p.item() / 0.1:.4f} | with eps inside the square root {eps_inside:.4f}")
    assert abs(-p.item() / 0.1 - g / (g + 1e-8)) < 1e-4

# %% [markdown]
# ### 2.4 Weight decay: L2 in the loss, or decoupled (AdamW)
#
# **Weight decay** (权重衰减) pulls the weights toward zero. There are two ways to do it, and they are the same for
# SGD but not for Adam:
#
# * **L2 regularisation** (L2 正则化): add $\tfrac{\lambda}{2}\lVert w\rVert^2$ to the loss, so $\lambda w$ is added
#   to the gradient. That is what `SGD(weight_decay=λ)` and `Adam(weight_decay=λ)` do.
# * **Decoupled weight decay** (解耦权重衰减): shrink the weights directly, $w \leftarrow w\,(1 - \eta\lambda)$, and
#   leave the gradient alone. That is **AdamW** (`torch.optim.AdamW`; in 2.14 it is `Adam` with
#   `decoupled_weight_decay=True`).
#
# For SGD the two coincide: $w - \eta(g + \lambda w) = w(1 - \eta\lambda) - \eta g$. For Adam they do not: the L2
# term goes through Adam's per-element scaling, so a weight with large gradients hardly decays (its $\lambda w$ is
# divided by a large $\sqrt{\hat v}$), and a weight with no gradient from the loss moves by about $\eta$ per step
# whatever $\lambda$ is (its only gradient, $\lambda w$, is normalised to ±1). AdamW shrinks every weight by the same
# factor, as $\lambda$ says. Loshchilov and Hutter (2019) found that this decoupled form generalises better and that
# its best $\lambda$ depends less on the learning rate; it is the usual choice for transformers.

# %%
seed_everything(0)
w_start = torch.randn(2)


def run(make_optimizer, l2=0.0, steps=20):
    w = w_start.clone().requires_grad_(True)
    optimizer = make_optimizer([w])
    for _ in range(steps):
        optimizer.zero_grad()
        (lsq_loss(w) + l2 / 2 * w.pow(2).sum()).backward()
        optimizer.step()
    return w.detach()


sgd_l2 = run(lambda p: torch.optim.SGD(p, lr=0.01), l2=0.5)
sgd_wd = run(lambda p: torch.optim.SGD(p, lr=0.01, weight_decay=0.5))
adam_l2 = run(lambda p: torch.optim.Adam(p, lr=0.1), l2=0.5)
adam_wd = run(lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.5))
adamw = run(lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.5))
torch.testing.assert_close(sgd_l2, sgd_wd)
torch.testing.assert_close(adam_l2, adam_wd)
torch.testing.assert_close(adamw, adam_by_hand(w_start, 20, lr=0.1, weight_decay=0.5, decoupled=True)[-1])
print("SGD:  L2 in the loss", fmt(sgd_l2, 3), "== weight_decay", fmt(sgd_wd, 3))
print("Adam: L2 in the loss", fmt(adam_l2, 3), "== weight_decay", fmt(adam_wd, 3), "| AdamW", fmt(adamw, 3))
assert (adamw - adam_wd).abs().max() > 0.05

print("a weight the loss ignores, 10 steps at lr 0.1, starting at 1:")
for wd in (0.01, 0.1):
    ends = {}
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        p = nn.Parameter(torch.ones(1))
        optimizer = cls([p], lr=0.1, weight_decay=wd)
        for _ in range(10):
            optimizer.zero_grad()
            (0 * p).sum().backward()  # the loss does not depend on p: its gradient is 0
            optimizer.step()
        ends[cls.__name__] = p.item()
    print(f"  weight_decay {wd}: Adam (L2) -> {ends['Adam']:.3f} | AdamW -> {ends['AdamW']:.3f}")
    assert ends["Adam"] < 0.1 and math.isclose(ends["AdamW"], (1 - 0.1 * wd) ** 10, rel_tol=1e-5)

# %% [markdown]
# With Adam's L2 the ignored weight falls to about 0.08 in 10 steps whether $\lambda$ is 0.01 or 0.1: the decay's
# strength is lost in the normalisation. AdamW shrinks it by exactly $(1 - \eta\lambda)^{10}$.
#
# ### 2.5 What `optimizer.state` holds, and `add_param_group`
#
# An optimizer has two parts. `optimizer.param_groups` is a list of dicts, each with its `params` and its options
# (`lr`, `momentum`, ...). `optimizer.state` maps each parameter tensor to a dict of the per-parameter tensors
# its algorithm keeps, created lazily at the first `step()`:
#
# | optimizer | `optimizer.state[p]` |
# |---|---|
# | `SGD(momentum=0)` | nothing |
# | `SGD(momentum>0)` | `momentum_buffer` (shape of `p`) |
# | `Adam`, `AdamW` | `step` (a 0-d float tensor: $t$), `exp_avg` ($m$), `exp_avg_sq` ($v$) |
#
# Adam's state is twice the size of the model; with the gradients, training with Adam holds four numbers per
# parameter, which is what ZeRO and FSDP (sharded data parallelism: each process keeps only a slice of this state)
# shard ([notebook 09](09_sharding_and_distributed_checkpoints.ipynb), §1).
# `optimizer.state_dict()` saves both parts, with the parameters replaced by their positions 0, 1, 2, …, which is why
# a checkpoint can only be loaded into an optimizer built over the same parameters in the same order
# ([notebook 06](06_save_load_checkpoints.ipynb), §1 and §5).

# %%
seed_everything(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
inputs = torch.randn(16, 4)
for make in (
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-3),
):
    model = copy.deepcopy(net)
    optimizer = make(model.parameters())
    empty = len(optimizer.state)
    model(inputs).pow(2).mean().backward()
    optimizer.step()
    state = optimizer.state[model[0].weight]
    numbers = sum(t.numel() for s in optimizer.state.values() for t in s.values() if t.ndim > 0)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{type(optimizer).__name__:4}: state before step {empty} entries, after {len(optimizer.state)} | "
        f"state of weight 0: { {k: tuple(t.shape) for k, t in state.items()} } | "
        f"{numbers} state numbers for {n_params} parameters"
    )
print("Adam's step counter:", state["step"], "| state_dict keys:", list(optimizer.state_dict()))
print("param_groups[0]['params'] in the state_dict:", optimizer.state_dict()["param_groups"][0]["params"])
assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and numbers == 2 * n_params

# %% [markdown]
# `optimizer.add_param_group(group)` adds a group to an existing optimizer, with the constructor's options as defaults
# for what the group does not set. The classic use is **fine-tuning** (微调): train a new head first, then unfreeze the
# pretrained **backbone** (主干网络) and add its parameters with a smaller learning rate. A parameter already in a group is
# refused. A learning-rate scheduler, taught in section 3, changes each group's `lr` at every call of
# its `step()`; `LambdaLR` multiplies each group's initial rate by a function of the step count, and keeps one
# function and one initial rate per group. A scheduler built before the new group does not know it. `LambdaLR` then
# fails at its next `step()` with `ValueError: zip() argument 2 is shorter than argument 1`: it pairs the optimizer's
# groups (two now) with the new rates it computed (one per function it knows: one), and `zip(..., strict=True)`
# refuses lists of different lengths. Other schedulers, such as `StepLR`, keep running, but their `base_lrs` (the initial
# rates they keep, one per group) has no entry for the new group. Build schedulers after the last group is added.

# %%
from torch.optim.lr_scheduler import LambdaLR, StepLR

seed_everything(0)
backbone, head = nn.Linear(4, 8), nn.Linear(8, 1)
optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.01)
head(torch.relu(backbone(inputs))).pow(2).mean().backward()
optimizer.step()  # only the head is trained so far
optimizer.add_param_group({"params": backbone.parameters(), "lr": 1e-4})
new_group = optimizer.param_groups[1]
print(
    "new group: lr",
    new_group["lr"],
    "| weight_decay",
    new_group["weight_decay"],
    "(default) | betas",
    new_group["betas"],
    "| state entries so far:",
    len(optimizer.state),
)
try:
    optimizer.add_param_group({"params": head.parameters()})
except ValueError as err:
    print(f"the head again -> {type(err).__name__}: {err}")

early = torch.optim.SGD(head.parameters(), lr=0.1)
scheduler = LambdaLR(early, lambda step: 0.5**step)
early.add_param_group({"params": backbone.parameters()})
early.step()
try:
    scheduler.step()
except ValueError as err:
    print(f"LambdaLR built before add_param_group -> {type(err).__name__}: {err}")

early = torch.optim.SGD(head.parameters(), lr=0.1)
step_scheduler = StepLR(early, step_size=1, gamma=0.5)
early.add_param_group({"params": backbone.parameters()})
early.step()
step_scheduler.step()
print(
    "StepLR built before add_param_group: lrs",
    [group["lr"] for group in early.param_groups],
    "| base_lrs",
    step_scheduler.base_lrs,
)
assert len(step_scheduler.base_lrs) == 1 and len(early.param_groups) == 2
assert len(optimizer.param_groups) == 2 and new_group["weight_decay"] == 0.01

# %% [markdown]
# ### 2.6 Parameter groups: a smaller learning rate for the backbone
#
# A **parameter group** (参数组) is a dict with a `params` entry and any option it overrides; options not given fall
# back to the keyword defaults. Here they are passed to the constructor at once: the backbone of a ResNet-18 gets a
# learning rate ten times smaller than its new classifier head (`fc`). `resnet18(weights=None)` builds the
# architecture with random weights; a pretrained model would pass `weights=ResNet18_Weights.DEFAULT` (which
# downloads the weights; older code writes `pretrained=True`, which torchvision 0.13 replaced). The backbone is
# selected by excluding the head's `id`s. A parameter listed in two groups is an error.

# %%
from torchvision.models import resnet18

seed_everything(0)
resnet = resnet18(weights=None, num_classes=10)
head_ids = {id(p) for p in resnet.fc.parameters()}
backbone = [p for p in resnet.parameters() if id(p) not in head_ids]
optimizer = torch.optim.SGD(
    [{"params": backbone, "lr": 1e-3}, {"params": resnet.fc.parameters()}],
    lr=1e-2,
    momentum=0.9,
    weight_decay=1e-4,
)
for name, group in zip(("backbone", "head"), optimizer.param_groups):
    n = sum(p.numel() for p in group["params"])
    print(
        f"{name:8} tensors={len(group['params']):2} numbers={n:>10,} lr={group['lr']} "
        f"momentum={group['momentum']} weight_decay={group['weight_decay']}"
    )
assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(resnet.parameters()))
try:
    torch.optim.SGD([{"params": resnet.parameters()}, {"params": resnet.fc.parameters()}], lr=0.1)
    refused = None
except ValueError as err:
    refused = err
    print(f"{type(err).__name__}: {err}")
assert refused is not None and "more than one parameter group" in str(refused)

# %% [markdown]
# ### 2.7 No weight decay for biases and normalisation weights
#
# Many training recipes (with AdamW as with SGD) exempt biases and the scale and shift of normalisation layers from
# weight decay. These are few numbers, and decaying them changes the function directly: it pulls each channel's
# output scale and offset toward zero. This is common practice rather than a law: the evidence that exempting them
# helps comes from particular models (ResNets, transformers), and some recipes decay everything with little
# difference.
#
# *(deeper: you can skip this on a first reading)* A related fact is measured below. A weight that feeds a normalisation layer (a linear layer or convolution
# followed by BatchNorm or LayerNorm) does not set the output's scale: multiplying it by 10 leaves the output
# unchanged and divides its gradient by 10. Weight decay on such a weight cannot shrink what the network computes;
# it shrinks the weight's norm, and a smaller norm makes the same learning rate take relatively larger steps, so
# its effect is on the effective learning rate (van Laarhoven, 2017). The bias before BatchNorm does nothing at all
# (the mean is subtracted), which is why a convolution followed by BatchNorm is usually built with `bias=False`.
#
# YOLOv5's detection code builds three groups: BatchNorm weights (no decay), other weights (decay), biases (no
# decay). It tests `isinstance(v, nn.BatchNorm2d)`, so a LayerNorm or GroupNorm weight would be decayed by mistake.
# A rule used by much code today covers those cases too: **decay tensors with two or more dimensions, not the 1-D
# ones** (biases, norm weights).

# %%
seed_everything(0)
lin, bn = nn.Linear(8, 4), nn.BatchNorm1d(4)
x = torch.randn(32, 8)
target = torch.randn(32, 4)
F.mse_loss(bn(lin(x)), target).backward()
out_before, grad_before = bn(lin(x)).detach(), lin.weight.grad.clone()
lin.zero_grad()
with torch.no_grad():
    lin.weight.mul_(10)
F.mse_loss(bn(lin(x)), target).backward()
print(
    f"Linear -> BatchNorm, weight x10: output changed by {(bn(lin(x)) - out_before).abs().max():.3f} | "
    f"gradient norm ratio {lin.weight.grad.norm() / grad_before.norm():.3f} | "
    f"gradient of the bias {lin.bias.grad.abs().max():.4f}"
)
assert (bn(lin(x)) - out_before).abs().max() < 1e-3 and lin.bias.grad.abs().max() < 1e-5
assert abs(lin.weight.grad.norm() / grad_before.norm() - 0.1) < 1e-3


def yolo_groups(model):  # YOLOv5's rule: BN weights / other weights / biases
    g0, g1, g2 = [], [], []
    for v in model.modules():
        if hasattr(v, "bias") and isinstance(v.bias, nn.Parameter):
            g2.append(v.bias)
        if isinstance(v, nn.BatchNorm2d):
            g0.append(v.weight)
        elif hasattr(v, "weight") and isinstance(v.weight, nn.Parameter):
            g1.append(v.weight)
    return g0, g1, g2


g0, g1, g2 = yolo_groups(resnet)
print(
    f"ResNet-18: BN weights {len(g0)}, decayed weights {len(g1)}, biases {len(g2)}, "
    f"total {len(g0) + len(g1) + len(g2)} of {len(list(resnet.parameters()))} parameter tensors"
)
decay = [p for p in resnet.parameters() if p.ndim >= 2]
no_decay = [p for p in resnet.parameters() if p.ndim < 2]
assert {id(p) for p in decay} == {id(p) for p in g1}
assert {id(p) for p in no_decay} == {id(p) for p in g0 + g2}
optimizer = torch.optim.SGD(
    [{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
    lr=0.1,
    momentum=0.9,
    nesterov=True,
)

block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
g0, g1, g2 = yolo_groups(block)
print(
    "with a LayerNorm, the isinstance rule decays",
    [tuple(p.shape) for p in g1],
    "- the ndim rule decays",
    [tuple(p.shape) for p in block.parameters() if p.ndim >= 2],
)
assert any(p is block[1].weight for p in g1)

# %% [markdown]
# ### 2.8 `optimizer.step(closure)`: L-BFGS
#
# *(deeper: you can skip this on a first reading)* Most optimizers take one step from the gradient already computed.
# `torch.optim.LBFGS`, a **quasi-Newton** method (拟牛顿法: it estimates the curvature, the second derivatives, from
# the last few gradients and steps toward the minimum of that estimate), needs the loss and gradient at new points
# *during* its step: one `step()` runs up to `max_iter` inner iterations (20 by default), and the optional **line
# search** (线搜索: trying several step lengths along the chosen direction and keeping one that lowers the loss
# enough; `line_search_fn="strong_wolfe"` names the standard conditions, on the loss and on its slope, that the
# kept length must meet) evaluates trial points too. So
# `step` takes a **closure** (闭包) that clears the gradients, recomputes the loss, calls `backward()` and returns
# the loss. On a least-squares problem L-BFGS reaches the exact solution in a few steps; `torch.linalg.lstsq`
# computes that solution directly.

# %%
seed_everything(0)
X = torch.randn(100, 3)
y = X @ torch.tensor([2.0, -1.0, 0.5]) + 0.1 * torch.randn(100)
w = torch.zeros(3, requires_grad=True)
lbfgs = torch.optim.LBFGS([w], lr=1, max_iter=20, line_search_fn="strong_wolfe")
calls = 0


def closure():
    global calls
    calls += 1
    lbfgs.zero_grad()
    loss = ((X @ w - y) ** 2).mean()
    loss.backward()
    return loss


for _ in range(2):
    lbfgs.step(closure)
exact = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1)
print("L-BFGS:", fmt(w, 3), "| lstsq:", fmt(exact, 3), "| closure called more than once per step:", calls > 2)
torch.testing.assert_close(w.detach(), exact, atol=1e-4, rtol=1e-4)
assert calls > 2

# %% [markdown]
# ## 3. Learning-rate schedules
#
# ### 3.1 Learning-rate schedulers: `LambdaLR`
#
# A **learning-rate scheduler** (学习率调度器) changes `param_groups[i]["lr"]` each time `scheduler.step()` is
# called. `LambdaLR(optimizer, f)` sets `lr = base_lr * f(epoch)`, where `epoch` counts the scheduler's steps so far
# (it is 0 when the scheduler is built, which already applies `f(0)`). With f(e) = (e + 1)² and base 0.1 the rates
# are 0.1, 0.4, 0.9, 1.6; since the gradient of `sum(x)` is 1, `x` moves by exactly the current rate. Read the rate
# in use with **`get_last_lr()`** (one value per group), or from `optimizer.param_groups`.

# %%
x = torch.tensor([1.0, 2.0], requires_grad=True)
optimizer = torch.optim.SGD([x], lr=0.1)
scheduler = LambdaLR(optimizer, lambda epoch: (epoch + 1) ** 2)
print("lr before any step:", fmt(scheduler.get_last_lr(), 1))
for i in range(3):
    optimizer.zero_grad()
    torch.sum(x).backward()
    optimizer.step()
    scheduler.step()
    print(f"after step {i}: x = {fmt(x, 4)}, next lr = {fmt(scheduler.get_last_lr(), 1)}")
torch.testing.assert_close(x.detach(), torch.tensor([-0.4, 0.6]))

# %% [markdown]
# With one parameter group per tensor and one function per group, `get_last_lr()` returns one rate per group:
# `[1, 2]`, then `[4, 4]`, then `[9, 6]`.

# %%
x = torch.tensor([1.0, 2.0], requires_grad=True)
z = torch.tensor(3.0, requires_grad=True)
optimizer = torch.optim.SGD([{"params": [x], "lr": 1}, {"params": [z], "lr": 2}])
scheduler = LambdaLR(optimizer, [lambda e: (e + 1) ** 2, lambda e: e + 1])
history = [scheduler.get_last_lr()]
for _ in range(2):
    optimizer.zero_grad()
    (torch.sum(x) + z).backward()
    optimizer.step()
    scheduler.step()
    history.append(scheduler.get_last_lr())
print(history)
assert history == [[1, 2], [4, 4], [9, 6]]

# %% [markdown]
# Older code reads the rate with `scheduler.get_lr()`. That is the internal formula a scheduler uses *inside*
# `step()`. For `LambdaLR` it happens to be a closed form, but for chainable schedulers such as `ExponentialLR` it
# multiplies the current rate by γ once more, so calling it from outside returns the *next* rate, with a warning.
# The other warning below comes from calling `scheduler.step()` before any `optimizer.step()`: since PyTorch 1.1
# the order is optimizer first, or the first value of the schedule is skipped.

# %%
p = nn.Parameter(torch.zeros(1))
optimizer = torch.optim.SGD([p], lr=0.1)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    scheduler.step()  # wrong order: no optimizer.step() yet
    from_get_lr = scheduler.get_lr()
for w in caught:
    print(f"{w.category.__name__}: {str(w.message)[:75]}...")
print(f"lr in use: get_last_lr() = {scheduler.get_last_lr()[0]:.3f} | get_lr() = {from_get_lr[0]:.3f}")
assert math.isclose(scheduler.get_last_lr()[0], 0.09) and math.isclose(from_get_lr[0], 0.081)
assert [w.category for w in caught] == [UserWarning, UserWarning]
assert "before `optimizer.step()`" in str(caught[0].message) and "get_last_lr()" in str(caught[1].message)

# %% [markdown]
# ### 3.2 Chained schedulers, warm-up, cosine, one-cycle
#
# Where `scheduler.step()` goes depends on what the schedule counts. An **epoch-based** schedule (`StepLR`,
# `MultiStepLR`, `ExponentialLR`, a cosine over epochs) is stepped once at the end of each epoch; a schedule
# measured in optimizer steps (a warm-up over the first iterations, `OneCycleLR`) is stepped after every batch.
#
# * **Chaining**: most schedulers multiply the current rate, so stepping two of them composes their effects:
#   `ExponentialLR(γ=0.9)` and `MultiStepLR(milestones=[30, 80], γ=0.1)` stepped together give
#   `0.1 · 0.9^e · 0.1^(milestones passed)`.
# * **Warm-up** (预热): a large learning rate at the start can diverge, so it is raised gradually. "Training
#   ImageNet in 1 Hour" (Goyal et al., 2017) scales the rate with the batch size and warms up over five epochs
#   ([notebook 08](08_data_parallel_ddp.ipynb), §7). `SequentialLR` runs a `LinearLR` warm-up, then hands over to
#   `CosineAnnealingLR`, which follows half a cosine from the base rate down to `eta_min`.
# * **One-cycle** (`OneCycleLR`) rises to `max_lr` then anneals far below the start.
# * **Warm restarts** (`CosineAnnealingWarmRestarts`, "SGDR") anneal along a cosine for `T_0` steps, then jump
#   back to the base rate and start again.

# %%
from torch.optim import lr_scheduler as sched


def lr_trace(make, steps=50, lr=0.1):
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
    schedulers = make(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        for s in schedulers:
            s.step()
    return rates


chained = lr_trace(lambda o: [sched.ExponentialLR(o, 0.9), sched.MultiStepLR(o, [30, 80], 0.1)], steps=100)
closed_form = [0.1 * 0.9**e * 0.1 ** sum(e >= m for m in (30, 80)) for e in range(100)]
np.testing.assert_allclose(chained, closed_form, rtol=1e-9)
print("chained Exponential x MultiStep matches 0.1 * 0.9**e * 0.1**(milestones passed) for 100 epochs")

traces = {
    "StepLR(20, 0.5)": lr_trace(lambda o: [sched.StepLR(o, 20, 0.5)]),
    "ExponentialLR(0.95)": lr_trace(lambda o: [sched.ExponentialLR(o, 0.95)]),
    "CosineAnnealingLR(50)": lr_trace(lambda o: [sched.CosineAnnealingLR(o, T_max=50, eta_min=0.001)]),
    "warm-up 5 + cosine": lr_trace(
        lambda o: [
            sched.SequentialLR(
                o,
                [sched.LinearLR(o, start_factor=0.1, total_iters=5), sched.CosineAnnealingLR(o, T_max=45)],
                milestones=[5],
            )
        ]
    ),
    "OneCycleLR(max 0.1)": lr_trace(lambda o: [sched.OneCycleLR(o, max_lr=0.1, total_steps=50, pct_start=0.3)]),
    "WarmRestarts(T_0=10)": lr_trace(lambda o: [sched.CosineAnnealingWarmRestarts(o, T_0=10)]),
}
for name, rates in traces.items():
    peak = rates.index(max(rates))
    print(f"{name:22} first {rates[0]:.4f}  peak {rates[peak]:.4f} at step {peak:2}  last {rates[-1]:.4f}")
warm = traces["warm-up 5 + cosine"]
assert math.isclose(warm[0], 0.01) and math.isclose(warm[5], 0.1) and warm[-1] < 0.001
one = traces["OneCycleLR(max 0.1)"]
assert math.isclose(max(one), 0.1) and one[0] < 0.01 and one[-1] < 1e-5
fig, ax = plt.subplots(figsize=(8, 3.5))
for name, rates in traces.items():
    ax.plot(rates, label=name)
ax.set(xlabel="scheduler step", ylabel="learning rate", title="Learning-rate schedules (base lr 0.1)")
ax.legend(fontsize=8, ncol=2)
plt.show()

# %% [markdown]
# ### 3.3 `ReduceLROnPlateau`, step by step
#
# `ReduceLROnPlateau` reads a validation metric instead of counting: `scheduler.step(val_loss)` once per epoch. It
# keeps the best value so far and counts the *bad epochs* in a row, those that do not improve on the best. An
# epoch counts as an improvement only if it beats the best by more than `threshold` (relative by default: in
# `mode="min"`, `val < best · (1 − 1e-4)`), so an equal loss is a bad epoch. When the count **exceeds**
# `patience`, that is at the (patience + 1)-th bad epoch in a row, the rate is multiplied by `factor` (0.1 by
# default) and the count restarts at 0. Options: `cooldown` epochs ignored after a cut, a floor `min_lr`, and
# `mode="max"` for a metric such as accuracy. The trace below uses `patience=2` and prints the scheduler's
# (public) attributes `best` and `num_bad_epochs` after each call.

# %%
optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
plateau = sched.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=2)
val_losses = [1.0, 0.8, 0.7, 0.7, 0.71, 0.72, 0.69, 0.69, 0.7, 0.7, 0.7]
rates = []
print("epoch  val loss  best   bad epochs  lr after step")
for epoch, val_loss in enumerate(val_losses):
    optimizer.step()
    lr_before = optimizer.param_groups[0]["lr"]
    plateau.step(val_loss)
    rates.append(optimizer.param_groups[0]["lr"])
    cut = "  <- cut: 3 bad epochs > patience 2" if rates[-1] < lr_before else ""
    print(f"{epoch:5}  {val_loss:8.2f}  {plateau.best:.2f}  {plateau.num_bad_epochs:10}  {rates[-1]:.4f}{cut}")
assert rates[4] == 0.1 and math.isclose(rates[5], 0.01) and math.isclose(rates[8], 0.01)
assert math.isclose(rates[9], 0.001) and plateau.num_bad_epochs == 1

# %% [markdown]
# Epochs 3, 4 and 5 do not improve on 0.70 (0.70 is not below 0.70 · (1 − 1e-4)); at the third, the count 3 exceeds
# the patience of 2 and the rate drops from 0.1 to 0.01 *after* epoch 5. Epoch 6 improves (0.69), epochs 7–9 do not,
# and the rate drops again after epoch 9. So `patience=2` tolerates two bad epochs and reacts to the third.
#
# ### 3.4 What annealing buys: one small run
#
# The shapes above mean something only when a model trains. Mini-batch SGD at a constant learning rate does not
# settle at the minimum: each step follows one batch's gradient, so the weights keep jittering around the minimum
# by an amount that grows with the rate. Lowering the rate at the end, **annealing** (退火), shrinks the jitter. The
# cell trains the same linear regression three times, 20 epochs of 16 batches each, stepping the scheduler after
# every batch, and measures how far the final training loss is above the best possible one (the least-squares
# solution).

# %%
seed_everything(0)
X = torch.randn(512, 20)
y = X @ torch.randn(20, 1) + 0.5 * torch.randn(512, 1)
X1 = torch.cat([X, torch.ones(512, 1)], dim=1)  # a column of ones for the bias
best_loss = F.mse_loss(X1 @ torch.linalg.lstsq(X1, y).solution, y).item()
steps = 20 * 16
schedules = {
    "constant": lambda o: None,
    "StepLR (÷10 twice)": lambda o: sched.StepLR(o, step_size=steps // 3, gamma=0.1),
    "cosine to 0": lambda o: sched.CosineAnnealingLR(o, T_max=steps),
}
excess = {}
for name, make in schedules.items():
    seed_everything(1)
    model = nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = make(optimizer)
    order = torch.Generator().manual_seed(2)
    for _epoch in range(20):
        for batch in torch.randperm(512, generator=order).split(32):
            optimizer.zero_grad()
            F.mse_loss(model(X[batch]), y[batch]).backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    with torch.no_grad():
        excess[name] = F.mse_loss(model(X), y).item() - best_loss
    print(f"{name:20} final loss above the best possible: {excess[name] * 1000:.2f} e-3")
assert (
    excess["constant"] > 2 * excess["StepLR (÷10 twice)"] and excess["StepLR (÷10 twice)"] > 30 * excess["cosine to 0"]
)

# %% [markdown]
# The constant rate ends about four times further from the minimum than the step schedule, and the cosine ends about
# 50 times closer still, 1e-5 above the minimum. The same effect, at scale, is why almost every recipe ends with a decaying rate.
# (`torch.randperm` with its own `torch.Generator` shuffles the batches identically for the three runs.)
#
# ## 4. Averaging weights, clipping gradients, accumulating them
#
# ### 4.1 Stochastic weight averaging (随机权重平均) and EMA
#
# **Stochastic weight averaging** (随机权重平均, SWA) averages the weights visited late in training, where SGD with
# a constant (or cyclic) learning rate bounces around a wide minimum (the jitter of section 3.4); the average sits
# nearer its centre, which Izmailov et al. (2018) found to generalise better, after long training with a high
# constant or cyclic rate. `torch.optim.swa_utils` provides:
#
# * `AveragedModel(model)`: a copy whose parameters are the running mean of the snapshots passed to
#   `update_parameters(model)` (`n_averaged` counts them);
# * `SWALR`: anneals the learning rate to a constant `swa_lr` for the SWA phase;
# * `update_bn(loader, swa_model)`: the averaged weights never saw data, so their BatchNorm statistics are wrong;
#   this resets them and recomputes them with one pass over the training data (a plain average over batches).
#
# We check the average against snapshots kept by hand and the BatchNorm mean against the data.

# %%
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn

seed_everything(0)
X = torch.randn(1024, 8)
y = (2 * X[:, :1] - X[:, 1:2]).tanh() + 0.1 * torch.randn(1024, 1)
train_loader = DataLoader(
    TensorDataset(X[:768], y[:768]), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
swa_model = AveragedModel(model)
swa_scheduler = SWALR(optimizer, swa_lr=0.05, anneal_epochs=3)
swa_start, epochs, snapshots = 10, 20, []
for epoch in range(epochs):
    model.train()
    epoch_loss = 0.0
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        epoch_loss += loss.item() / len(train_loader)
    if epoch % 5 == 4:
        print(f"epoch {epoch + 1:2}: mean training loss {epoch_loss:.3f}, lr {optimizer.param_groups[0]['lr']:.3f}")
    if epoch >= swa_start:
        swa_model.update_parameters(model)
        swa_scheduler.step()
        snapshots.append([p.detach().clone() for p in model.parameters()])
for averaged, *history in zip(swa_model.module.parameters(), *snapshots):
    torch.testing.assert_close(averaged, torch.stack(history).mean(0))
print(
    "n_averaged =", swa_model.n_averaged.item(), "| SWA parameters equal the mean of the", len(snapshots), "snapshots"
)

stale_mean = swa_model.module[1].running_mean.clone()
update_bn(train_loader, swa_model)
with torch.no_grad():
    bn_input_mean = swa_model.module[0](X[:768]).mean(0)
torch.testing.assert_close(swa_model.module[1].running_mean, bn_input_mean, atol=1e-5, rtol=1e-5)
print(
    "BN running mean was stale before update_bn:",
    not torch.allclose(stale_mean, bn_input_mean),
    "| after: it equals the mean of BN's inputs over the training data",
)

model.eval()
swa_model.eval()
with torch.no_grad():
    test_final = F.mse_loss(model(X[768:]), y[768:]).item()
    test_swa = F.mse_loss(swa_model(X[768:]), y[768:]).item()
print(f"test MSE: last weights {test_final:.3f} | SWA weights {test_swa:.3f}")
assert 0.95 * test_final < test_swa < 1.1 * test_final  # within -5 % / +10 % of the last weights: no clear gain

# %% [markdown]
# The printed rate shows `SWALR` taking over after epoch 10 (it anneals from 0.1 to `swa_lr` = 0.05 over 3 epochs).
# Here SWA is **not** better: the averaged weights score a slightly higher test error than the last ones (the
# assert allows SWA at most 5 % lower, to stay true under other rounding, and at most 10 % higher). This run
# is short (20 epochs, averaging the last 10 at a moderate rate) on an easy problem, so the last weights already
# sit near the minimum and averaging adds nothing. SWA pays off where its authors used it: long training with a
# high constant or cyclic learning rate, where the iterates keep moving around a wide minimum. Measure it on your
# own validation set before keeping it.
#
# An **exponential moving average** (指数移动平均, EMA) of the weights is the same tool with another averaging rule:
# `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))` keeps `ema = decay · ema + (1 − decay) · w`
# (the first update copies the weights). Pass `use_buffers=True` to average BatchNorm's buffers too instead of
# calling `update_bn`.

# %%
layer = nn.Linear(2, 1)
ema = AveragedModel(layer, multi_avg_fn=get_ema_multi_avg_fn(0.9))
w0 = layer.weight.detach().clone()
ema.update_parameters(layer)  # first update: a copy
with torch.no_grad():
    layer.weight.add_(1.0)
ema.update_parameters(layer)
torch.testing.assert_close(ema.module.weight, 0.9 * w0 + 0.1 * (w0 + 1))
print("EMA weight moved by", fmt(ema.module.weight - w0, 4), "= 0.1 of the change")

# %% [markdown]
# ### 4.2 Gradient clipping (梯度裁剪)
#
# **Gradient clipping** (梯度裁剪) limits the size of an update when a batch produces a huge gradient. It goes between
# `loss.backward()` (which makes the gradients) and `optimizer.step()` (which uses them).
# `clip_grad_norm_(parameters, max_norm)` treats all gradients as **one** concatenated vector: it computes their
# total norm and multiplies every gradient by `min(1, max_norm / (total_norm + 1e-6))`, so only a norm above
# `max_norm` shrinks them (the multiplication always happens: an `if` would force a GPU-to-CPU synchronisation).
# The direction is kept, and the function returns the norm *before* clipping (useful to log). We check it against
# the norm computed by hand; `F.cosine_similarity` (the cosine of the angle between two vectors) then shows that
# `clip_grad_value_`, which clamps each element to [−v, v], changes the direction.

# %%
seed_everything(0)
net = nn.Sequential(nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 1))
(100 * net(torch.randn(32, 10)).pow(2).mean()).backward()
grads = [p.grad.clone() for p in net.parameters()]
by_hand = torch.sqrt(sum((g**2).sum() for g in grads))
returned = nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
after = torch.sqrt(sum((p.grad**2).sum() for p in net.parameters()))
print(f"total norm by hand {by_hand:.2f} | returned {returned:.2f} | after clipping {after:.4f}")
torch.testing.assert_close(returned, by_hand)
assert abs(after - 1.0) < 1e-5
for g, p in zip(grads, net.parameters()):  # every gradient scaled by the same factor
    torch.testing.assert_close(p.grad, g / (by_hand + 1e-6))

for p, g in zip(net.parameters(), grads):
    p.grad = g.clone()
nn.utils.clip_grad_value_(net.parameters(), clip_value=0.5)
flat_before = torch.cat([g.flatten() for g in grads])
flat_after = torch.cat([p.grad.flatten() for p in net.parameters()])
cosine = F.cosine_similarity(flat_before, flat_after, dim=0)
print(f"clip_grad_value_: max |grad| {flat_after.abs().max():.2f}, direction changed (cosine {cosine:.3f})")
assert flat_after.abs().max() <= 0.5 and cosine < 0.999

# %% [markdown]
# "One vector" has a consequence: tensors clipped together share one budget. Two tensors `x` and `z` of two
# elements, each with gradient `[1, 1]`, have norm √2 each; clipped separately to 1 each element becomes 0.7071,
# clipped together (total norm 2) each becomes 0.5. Under mixed precision, clip after `scaler.unscale_(optimizer)`
# ([notebook 07](07_mixed_precision.ipynb), §4).
#
# A gradient with a NaN or an infinity makes the total norm non-finite, and the clip then multiplies every gradient
# by NaN (or by 0) without a word. `error_if_nonfinite=True` raises instead. Since PyTorch 2.6 the two halves are also
# available separately, `nn.utils.get_total_norm(grads)` and `nn.utils.clip_grads_with_norm_(params, max_norm,
# total_norm)`, for code that must combine the norms of shards held by several processes before clipping.

# %%
x, z = nn.Parameter(torch.tensor([1.0, 2.0])), nn.Parameter(torch.tensor([2.0, 3.0]))
(x.sum() + z.sum()).backward()
nn.utils.clip_grad_norm_(x, 1.0)
nn.utils.clip_grad_norm_(z, 1.0)
print("clipped separately:", fmt(x.grad), fmt(z.grad))
(x.grad, z.grad) = (torch.ones(2), torch.ones(2))
nn.utils.clip_grad_norm_([x, z], 1.0)
print("clipped together:  ", fmt(x.grad), fmt(z.grad))
torch.testing.assert_close(x.grad, torch.full((2,), 0.5))

x.grad = torch.tensor([1.0, float("inf")])
try:
    nn.utils.clip_grad_norm_([x], 1.0, error_if_nonfinite=True)
except RuntimeError as err:
    print(f"{type(err).__name__}: {str(err).split(', so')[0]}")
x.grad = torch.tensor([1.0, float("nan")])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    norm = nn.utils.clip_grad_norm_([x], 1.0)
print(f"without the check: total norm {norm.item()}, gradient after clipping {fmt(x.grad)}, warnings {len(caught)}")
assert x.grad.isnan().all() and not caught

for p, g in zip(net.parameters(), grads):  # the original gradients again
    p.grad = g.clone()
total = nn.utils.get_total_norm([p.grad for p in net.parameters()])
nn.utils.clip_grads_with_norm_(net.parameters(), 1.0, total)
torch.testing.assert_close(total, by_hand)
for g, p in zip(grads, net.parameters()):
    torch.testing.assert_close(p.grad, g / (by_hand + 1e-6))
print(f"get_total_norm {total:.2f}, then clip_grads_with_norm_: the same gradients as clip_grad_norm_")

# %% [markdown]
# ### 4.3 Gradient accumulation (梯度累加): when it equals the big batch, and when it does not
#
# **Gradient accumulation** (梯度累加) runs forward and backward on several **micro-batches** (微批次) and steps once, because
# `.grad` adds up across backward passes ([notebook 02](02_autograd.ipynb), §4). It is used when a batch does not
# fit in memory, so call `backward()` after each micro-batch: that frees the micro-batch's graph at once. Summing
# the micro-batch losses and calling `backward()` once gives the same gradient but keeps every micro-batch's saved
# activations alive until then, which is the memory accumulation was meant to save.
#
# The usual recipe divides each micro-batch's mean loss by the number of micro-batches $k$. That reproduces the
# big batch's gradient exactly when every sample carries the same weight as in the big batch and no sample's loss
# depends on another sample. Four common cases break it:
#
# 1. **Uneven micro-batches.** With sizes 24, 24 and 16, "mean of each, divided by 3" weights a sample of the last
#    micro-batch by 1/(3·16) instead of 1/64. Fix: sum the per-sample losses (`reduction="sum"`) and divide by the
#    true number of samples in the whole batch (here 64); a mean times `len(micro) / len(batch)` is the same.
#    [Notebook 04](04_mnist_cnn.ipynb)'s Exercise 3 practises exactly this.
# 2. **A mean over tokens with padding.** A sequence model averages over the valid (unpadded) positions. Each
#    micro-batch's mean is over *its* valid tokens, so a token in a micro-batch of short sequences weighs more.
#    Fix: sum over valid tokens and divide by the number of valid tokens in the whole batch, counted before the
#    micro-batches run.
# 3. **BatchNorm.** It normalises each micro-batch with that micro-batch's mean and variance, so the forward pass
#    itself differs; no weighting fixes it. Use a norm that does not mix samples (LayerNorm, GroupNorm), or accept
#    the difference.
# 4. *(deeper: you can skip this on a first reading)* **Losses that compare samples with each other**, such as **contrastive losses** (对比损失) with in-batch
#    negatives (CLIP, SimCLR): each sample is scored against the others in its batch, and a micro-batch has fewer
#    others. No reweighting helps either. An exact fix is a two-pass trick ("gradient caching", Gao et al. 2021):
#    compute every embedding without a graph, take the loss and its gradient with respect to the embeddings on the
#    whole batch, then re-run each micro-batch with a graph and backpropagate those embedding gradients with
#    `torch.autograd.backward(outputs, grad_tensors)` ([notebook 03](03_dynamic_graphs_and_hooks.ipynb), §7).
#
# The contrastive loss below scores every pair by the cosine of the angle between two embeddings: `F.normalize(z,
# dim=1)` divides each row by its length, so the product of two normalised rows is their cosine similarity.
# Dividing the cosines by 0.5 (the **temperature**, 温度) spreads them out, which sharpens the softmax that
# `cross_entropy` takes over each row.
#
# The cell measures the largest gradient difference from the big batch for each case, without and with its fix.

# %%
seed_everything(0)
X, y = torch.randn(64, 10), torch.randn(64, 1)
equal_chunks = torch.arange(64).split(16)
uneven_chunks = torch.arange(64).split([24, 24, 16])


def make_model(batch_norm=False, width=1):
    seed_everything(1)
    norm = [nn.BatchNorm1d(16)] if batch_norm else []
    return nn.Sequential(nn.Linear(10, 16), *norm, nn.ReLU(), nn.Linear(16, width))


def gap(model, big_loss, micro_loss, chunks):
    """Largest |difference| between the big batch's gradient and the accumulated one."""
    big, small = model, copy.deepcopy(model)
    big_loss(big).backward()
    for chunk in chunks:
        micro_loss(small, chunk).backward()
    return max((a.grad - b.grad).abs().max().item() for a, b in zip(big.parameters(), small.parameters()))


def mse(model, rows, reduction="mean"):
    return F.mse_loss(model(X[rows]), y[rows], reduction=reduction)


everything = torch.arange(64)
results = {
    "equal micro-batches, mean / k": gap(
        make_model(), lambda m: mse(m, everything), lambda m, c: mse(m, c) / 4, equal_chunks
    ),
    "uneven 24/24/16, mean / k": gap(
        make_model(), lambda m: mse(m, everything), lambda m, c: mse(m, c) / 3, uneven_chunks
    ),
    "uneven, fixed: sum / 64": gap(
        make_model(), lambda m: mse(m, everything), lambda m, c: mse(m, c, "sum") / 64, uneven_chunks
    ),
}

# sequences of 8 positions, with 1 to 8 valid ones; sorted by length as a length-bucketing loader would
Xs, ys = torch.randn(64, 8, 10), torch.randn(64, 8, 1)
lengths = torch.randint(1, 9, (64,)).sort().values
valid = (torch.arange(8) < lengths[:, None]).unsqueeze(-1).float()
print("valid tokens per micro-batch:", [int(valid[c].sum()) for c in equal_chunks])


def token_loss(model, rows, divide_by=None):
    squared = (model(Xs[rows]) - ys[rows]) ** 2 * valid[rows]
    return squared.sum() / (valid[rows].sum() if divide_by is None else divide_by)


n_tokens = valid.sum()  # counted over the whole batch, before accumulating
results["per-token mean, mean / k"] = gap(
    make_model(), lambda m: token_loss(m, everything), lambda m, c: token_loss(m, c) / 4, equal_chunks
)
results["per-token, fixed: sum / all tokens"] = gap(
    make_model(), lambda m: token_loss(m, everything), lambda m, c: token_loss(m, c, divide_by=n_tokens), equal_chunks
)
results["BatchNorm, mean / k"] = gap(
    make_model(batch_norm=True), lambda m: mse(m, everything), lambda m, c: mse(m, c) / 4, equal_chunks
)

# a contrastive loss: row i of A should match row i of B, against every other row of B in the batch
A, B = torch.randn(64, 10), torch.randn(64, 10)


def contrastive(za, zb):
    logits = F.normalize(za, dim=1) @ F.normalize(zb, dim=1).T / 0.5
    return F.cross_entropy(logits, torch.arange(len(za)))


encoder = make_model(width=8)
results["contrastive, mean / k"] = gap(
    encoder, lambda m: contrastive(m(A), m(B)), lambda m, c: contrastive(m(A[c]), m(B[c])) / 4, equal_chunks
)

big, cached = make_model(width=8), make_model(width=8)
contrastive(big(A), big(B)).backward()
with torch.no_grad():  # pass 1: every embedding, no graph kept
    za, zb = cached(A), cached(B)
za.requires_grad_(True)
zb.requires_grad_(True)
contrastive(za, zb).backward()  # the loss on the whole batch: gradients w.r.t. the embeddings
for c in equal_chunks:  # pass 2: one micro-batch at a time, with a graph
    torch.autograd.backward([cached(A[c]), cached(B[c])], [za.grad[c], zb.grad[c]])
results["contrastive, fixed: gradient caching"] = max(
    (a.grad - b.grad).abs().max().item() for a, b in zip(big.parameters(), cached.parameters())
)

for name, difference in results.items():
    verdict = "same as the big batch" if difference < 1e-5 else f"differs by up to {difference:.2f}"
    print(f"{name:38} {verdict}")
same = [name for name, difference in results.items() if difference < 1e-5]
assert same == [
    "equal micro-batches, mean / k",
    "uneven, fixed: sum / 64",
    "per-token, fixed: sum / all tokens",
    "contrastive, fixed: gradient caching",
]
assert all(difference > 1e-2 for name, difference in results.items() if name not in same)

# %% [markdown]
# Every broken case differs by far more than rounding, and every fix brings the gradient back to the big batch's
# within float32 precision, except for BatchNorm, which has no fix by reweighting. With mixed precision the
# recipe is the same, with the scaler's `step` and `update` once per accumulated batch
# ([notebook 07](07_mixed_precision.ipynb), §4). Under DDP, `no_sync()` skips the all-reduce on all but the last
# micro-batch ([notebook 08](08_data_parallel_ddp.ipynb), §3).

# %% [markdown]
# ## Exercises (练习)
#
# Four exercises, easiest first: predict, write a module, write an optimizer's update, then a stretch that combines
# sections 2.4, 2.7, 3.1 and 3.2 with the training loop of notebook 04. Each has a **stub cell** that starts with
# `# ✏️ Exercise N`: edit it and run it. The **check cell** below it then says *correct*, or *not yet* with a hint
# and the section to re-read, or *not attempted yet* while the stub is untouched. This section does not depend on
# the lesson's cells: after a kernel restart, run its first cell and go on. `make progress` (without make, e.g. on
# Windows: `python tools/course.py progress`) lists which exercises of every notebook pass.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("10")

# %% [markdown]
# ### Exercise 1 · Count what a module registers
#
# Sections 1.1 and 1.2 showed what a module registers and what it does not see. Apply that to this module
# (BatchNorm's buffers are listed in section 1.1 and in [notebook 06](06_save_load_checkpoints.ipynb), §1):
#
# ```python
# class Net(nn.Module):
#     def __init__(self):
#         super().__init__()
#         self.body = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
#         self.extra = [nn.Linear(4, 4)]
#         self.norm = nn.BatchNorm1d(4)
#         self.scale = nn.Parameter(torch.ones(4))
#         self.register_buffer("mask", torch.ones(4), persistent=False)
#         self.offset = torch.zeros(4)
# ```
#
# Predict, on paper first, for `net = Net()`: (1) `sum(p.numel() for p in net.parameters())`,
# (2) `len(list(net.buffers()))`, (3) `len(net.state_dict())`, and (4), from section 1.7, the value of every
# element that survives `nn.Dropout(p=0.2)` in training mode applied to `torch.ones(10)`.

# %%
# ✏️ Exercise 1: replace ... with [parameters, buffers, state_dict keys, survivor value], e.g. [10, 2, 5, 1.5]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · LayerNorm as a module
#
# Section 1.9 wrote LayerNorm as a formula. Make it a layer: `MyLayerNorm(n, eps=1e-5)` normalises each vector
# along the **last** dimension (size `n`) with the biased variance and `eps`, then multiplies by a learnable
# `weight` (initially ones) and adds a learnable `bias` (initially zeros), both of shape `(n,)`, exactly as
# `nn.LayerNorm(n, eps=eps)`. It must work for inputs of any number of dimensions, train (its parameters and its
# input get `nn.LayerNorm`'s gradients) and follow `.to(torch.float64)` (section 1.1). Write the formula with tensor operations: the check
# refuses `F.layer_norm` and the other library normalisations, and a subclass of `nn.LayerNorm`.


# %%
# ✏️ Exercise 2: write __init__ and forward
class MyLayerNorm(nn.Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        super().__init__()
        raise NotImplementedError("your code here")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("your code here")


# %%
ex.check(2, MyLayerNorm)

# %% [markdown]
# ### Exercise 3 · AdamW, one step at a time
#
# Sections 2.3 and 2.4 wrote Adam and its decoupled weight decay as formulas. Write `adamw_step(params, state, lr,
# betas, eps, weight_decay)`: one step of AdamW on every tensor of the list `params`, **in place**, from each one's
# `.grad` (the check gives every tensor one), so that calling it after every backward moves the parameters (up to rounding) as
# `torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)` would, step for step. `state`
# is a dict, empty at the first call, that the caller passes back unchanged at every later call: keep in it what
# the update needs from one step to the next (section 2.5 lists what `optimizer.state` holds). Use tensor
# operations, not `torch.optim`: the check compares your parameters with AdamW's after every step, and refuses an
# answer that runs the library's optimizer.


# %%
# ✏️ Exercise 3: write the body of the function
def adamw_step(params, state, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    raise NotImplementedError("your code here")


# %%
ex.check(3, adamw_step)

# %% [markdown]
# ### Exercise 4 · AdamW, decay groups and warm-up + cosine, in notebook 04's loop (stretch)
#
# A common recipe for training a transformer combines AdamW, decay groups and a warm-up followed by a cosine. Write
# `fit(model, loader, epochs, lr, weight_decay, warmup_steps)`, which trains `model` on the `(x, y)` batches of
# `loader` with:
#
# * `torch.optim.AdamW` (section 2.4) at learning rate `lr`, with weight decay `weight_decay` on every parameter
#   tensor of two or more dimensions and `0` on the 1-D ones (section 2.7);
# * a learning-rate scheduler (a `LambdaLR`, or a chain of built-in ones) stepped after **every batch**, whose factor
#   warms up linearly, then follows a half cosine down to zero (sections 3.1–3.2): $f(s) = (s+1)/w$ for $s < w$,
#   else $\tfrac12\bigl(1 + \cos(\pi (s - w) / (T - w))\bigr)$, where $s$ counts the scheduler's steps so far,
#   $w$ is `warmup_steps` and $T$ = `epochs * len(loader)`;
# * the training step of [notebook 04](04_mnist_cnn.ipynb), §13, with `F.mse_loss(model(x), y)` as the loss.
#
# Return `(optimizer, lrs)`, where `lrs[i]` is the learning rate of the i-th optimizer step, read from
# `optimizer.param_groups[0]["lr"]` just before that step.


# %%
# ✏️ Exercise 4: write the body of the function
def fit(model, loader, epochs, lr, weight_decay, warmup_steps):
    raise NotImplementedError("your code here")


# %%
ex.check(4, fit)

# %% [markdown]
# ## Summary
#
# * `nn.Module.__setattr__` files sub-modules, `nn.Parameter`s (through `register_parameter`) and registered
#   buffers; anything else (a Python list of layers, a plain tensor) is invisible to `parameters()`, `state_dict()`
#   and `.to()`. Use `ModuleList`/`Sequential`/`ParameterList` and `register_buffer`.
# * A module called twice is one set of parameters whose gradient sums both uses; a tied weight is counted once by
#   `parameters()` and stored under each name by `state_dict()`. `parameters()` is a one-shot generator. An unused
#   layer still costs memory. `FlopCounterMode` counts FLOPs.
# * `modules()`/`named_modules()` drive initialisation (`add_module` refuses dotted names); `nn.Linear` defaults to
#   a uniform draw in ±1/√fan_in and stores its weight as (out, in). A layer is its `F.` function plus state:
#   `F.dropout` ignores `eval()` unless given `training=self.training`. Dropout scales survivors by 1/(1 − p).
# * `var()` divides by n − 1 and is unbiased; `std()` uses the same correction but is biased low; LayerNorm uses
#   `correction=0`. A load pre-hook can rename old checkpoint keys.
# * The optimizer holds references to parameters: build it after moving the model. SGD's momentum buffer is
#   `b = μb + g`, Nesterov steps with `g + μb`; Adam divides bias-corrected moments, `m̂ / (√v̂ + ε)`, so its first
#   step is ±lr whatever the gradient's scale. L2 in the loss equals `weight_decay` for SGD and Adam; AdamW's
#   decoupled decay differs and shrinks every weight by `1 − lr·λ`. `optimizer.state` holds `momentum_buffer` or
#   `step`/`exp_avg`/`exp_avg_sq` (Adam: twice the model's size); `add_param_group` adds a group, before any
#   scheduler is built.
# * Parameter groups give per-group learning rates and weight decay; exempt 1-D tensors from decay (the `ndim`
#   rule covers every norm layer). A weight followed by a normalisation layer is scale-invariant: decay changes its
#   effective learning rate. `LBFGS` needs `step(closure)`.
# * Read rates with `get_last_lr()`, step the optimizer before the scheduler, per epoch or per batch as the
#   schedule counts; `ReduceLROnPlateau` cuts at the (patience + 1)-th bad epoch in a row. Annealing brought a
#   noisy SGD run far closer to the minimum than a constant rate.
# * SWA (`AveragedModel`, `SWALR`, `update_bn`) averages late weights; it did not help this short run. EMA is the
#   same tool with another rule. `clip_grad_norm_` scales all gradients together, returns the norm before clipping,
#   and with `error_if_nonfinite=True` refuses NaN; `clip_grad_value_` changes the direction.
# * Accumulation equals the big batch only when every sample keeps its big-batch weight and no loss couples
#   samples: fix uneven micro-batches and per-token means by summing and dividing by the true count; BatchNorm has
#   no such fix; contrastive losses need gradient caching.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson was built from a teacher's study notes written for PyTorch 1.x (in Chinese). If you studied them,
# this table lists where they differ from PyTorch 2.14 and where the lesson shows it.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | `Module.__init__` creates `OrderedDict`s for parameters, buffers, sub-modules and hooks (torch 1.6 source) | `_parameters`, `_buffers` and `_modules` are plain `dict`s; the hook registries are still `OrderedDict`s | §1.1 · Where a module keeps its state |
# | BatchNorm keeps a "running mean & running std" | its buffers are `running_mean`, `running_var` and `num_batches_tracked` | §1.1 · Where a module keeps its state |
# | layers in a Python `list` are not added to the network, "probably because of local scope" | scope has nothing to do with it: `__setattr__` registers only `Module`s and `Parameter`s | §1.2 · `ModuleList` and `Sequential` versus a Python list |
# | GFLOPs via `model.layers[0].flops() / 1e9` | `flops()` is a method of one model's own code; `torch.utils.flop_counter.FlopCounterMode` counts any model | §1.4 · Counting parameters and FLOPs |
# | copy layers with `conv_model.add_module(name, layer)` for each pair of `named_modules()` | fails on nested models: names such as `0.0` contain dots, which `add_module` refuses (`KeyError`) | §1.5 · Initialisation by walking `modules()` |
# | `TwoLayerNet(D_in, H, D_out)` | its `__init__` ignores its arguments and hard-codes 1000, 100, 10 | §1.6 · Custom layers, with and without parameters |
# | `torch.std` and `torch.var` "both compute the unbiased estimate" | both divide by n − 1; that makes the variance unbiased, not its square root (mean `std()` ≈ 0.886 σ for n = 3) | §1.9 · LayerNorm by hand, and biased versus unbiased variance |
# | hand-written LayerNorm rescales `var()` by (C − 1)/C | correct; `var(correction=0)` says it directly | §1.9 · LayerNorm by hand, and biased versus unbiased variance |
# | optimizer parameters "should be `Variable` instances" | `Variable` was merged into `Tensor` in 0.4; `Variable(t)` returns a tensor | §2.1 · The optimizer holds references |
# | move the model to the GPU before building the optimizer, because `.cuda()`/`.to()` create new parameter objects | `.to()` now converts in place (same objects); the order is still the safe one, and the old behaviour is shown with `torch.__future__` | §2.1 · The optimizer holds references |
# | `resnet18(pretrained=True)` | `weights=ResNet18_Weights.DEFAULT` (torchvision 0.13); `pretrained=` is deprecated | §2.6 · Parameter groups |
# | YOLOv5's groups: `isinstance(v, nn.BatchNorm2d)` marks the weights exempt from decay | a LayerNorm or GroupNorm weight is decayed by mistake; exempt every tensor with `ndim < 2` | §2.7 · No weight decay for biases and normalisation weights |
# | `scheduler.get_lr()` returns the current learning rate | internal; warns when called from outside and returns the *next* rate for chainable schedulers; use `get_last_lr()` | §3.1 · Learning-rate schedulers: `LambdaLR` |
# | `LambdaLR` example: the "simplified output" labels both lines of a step "before optimizer.step()" | the second line is printed after the step (x has moved) | §3.1 · Learning-rate schedulers: `LambdaLR` |
# | call `scheduler.step()` once at the end of each epoch | right for epoch-based schedules; warm-ups and `OneCycleLR` count batches and are stepped after every batch | §3.2 · Chained schedulers, warm-up, cosine, one-cycle |
# | the clipping example calls `clip_grad_norm_` after computing the loss, with no `loss.backward()` | clip between `backward()` (which makes the gradients) and `step()` | §4.2 · Gradient clipping |
# | `clip_grad_norm_` (1.9 source) scales the gradients only `if clip_coef < 1`, and warns (FutureWarning) on a non-finite norm | it always multiplies by `min(1, max_norm / (norm + 1e-6))`, with no GPU-to-CPU synchronisation (same result); a non-finite norm turns the gradients into NaN (NaN norm) or into zeros and NaN (infinite norm: `[1, inf]` becomes `[0, nan]`), without a warning unless `error_if_nonfinite=True` | §4.2 · Gradient clipping |
# | gradient accumulation: "two forwards, then one backward"; it only affects BatchNorm-like layers | backward after each micro-batch frees its graph; uneven micro-batches, per-token means and contrastive losses also differ from the big batch | §4.3 · Gradient accumulation |
