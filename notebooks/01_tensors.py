# %% [markdown]
# # 01 · Tensors (张量)
#
# A tensor is PyTorch's n-dimensional array: the numbers a model reads, computes with and learns. This notebook
# teaches how to create tensors, what their types and shapes are, how they share memory with NumPy and images,
# how shapes combine in arithmetic (broadcasting, matrix products), and how to move them to a GPU.
#
# **You should know:** Python and a little NumPy. **Runs in:** about 5 seconds on a 2-core CPU.
# **On a GPU:** the last section moves tensors to `cuda`; everything else is the same.
#
# The course follows a teacher's study notes written for PyTorch 1.x. Where the notes use APIs that are gone
# or misleading today (legacy constructors such as `torch.IntTensor`, named tensors, `torch.set_default_tensor_type`)
# this notebook says so and shows the current way.

# %%
import numpy as np
import torch

from utils import get_device, seed_everything, show

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown]
# ## 1. Data types (数据类型)
#
# Every tensor has one `dtype`. They map almost one-to-one onto NumPy's dtypes (there is no string tensor).
# Neural networks compute in `float32` by default; `int64` ("long") is the type of class labels and indices;
# `bool` is the type of masks. `float16` and `bfloat16` are the half-precision types of mixed-precision training
# (notebook 07).

# %%
pairs = [
    (torch.float64, np.float64), (torch.float32, np.float32), (torch.float16, np.float16),
    (torch.int64, np.int64), (torch.int32, np.int32), (torch.int16, np.int16),
    (torch.int8, np.int8), (torch.uint8, np.uint8), (torch.bool, np.bool_),
]
for t_dtype, np_dtype in pairs:
    converted = torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype
    assert converted == t_dtype
    print(f"{str(t_dtype):15} <-> numpy.{np.dtype(np_dtype).name:8} {t_dtype.itemsize} byte(s)")
print("aliases:", torch.float is torch.float32, torch.double is torch.float64, torch.long is torch.int64)

# %% [markdown]
# PyTorch **infers** the dtype from the Python value: an integer becomes `int64`, a float becomes `float32`
# (not `float64` as in NumPy!), a boolean becomes `bool`. Pass `dtype=` to choose.

# %%
for value in (1, 2.0, True):
    t = torch.tensor(value)
    print(f"torch.tensor({value!r:5}) -> {t}  {t.dtype}")
print("numpy infers", np.array(2.0).dtype, "but torch infers", torch.tensor(2.0).dtype)
print(torch.tensor(1, dtype=torch.int32), torch.tensor(2.0, dtype=torch.double))

# %% [markdown]
# **A trap in the notes.** The notes also build tensors with the legacy constructors `torch.IntTensor(1)` and
# `torch.Tensor(...)` and print `tensor([5], dtype=torch.int32)`. That `5` is garbage: with an integer argument the
# legacy constructor allocates *uninitialised memory* of that size; it does not store the number 1. Use
# `torch.tensor(data)` to store data, and `torch.empty/zeros/ones(size)` to allocate.

# %%
legacy = torch.IntTensor(1)  # a tensor of shape (1,) with whatever was in memory
modern = torch.tensor([1], dtype=torch.int32)
print("torch.IntTensor(1).shape =", tuple(legacy.shape), "  (its value is undefined)")
print("torch.tensor([1], dtype=torch.int32) =", modern)
assert legacy.shape == modern.shape == (1,) and modern.item() == 1

# %% [markdown]
# Converting between dtypes: `.float()`, `.long()`, ... or `.to(dtype)` (the general form, which also moves
# devices), `.type(dtype)`, and `.type_as(other)` (take the dtype of another tensor). Converting a float to an
# integer type **truncates toward zero**.

# %%
i = torch.tensor(1)
x = i.float()
print(x, x.dtype, "|", i.type(torch.float16).dtype, "|", i.to(torch.float64).dtype, "|", i.type_as(x).dtype)
print(torch.tensor([-1.7, 1.7]).long())

# %% [markdown]
# The notes set a global default with `torch.set_default_tensor_type(torch.FloatTensor)`. That function has been
# deprecated since PyTorch 2.1: use `torch.set_default_dtype(torch.float32)` (and `torch.set_default_device` for
# the device). The default is already `float32`.

# %%
print("default dtype:", torch.get_default_dtype())
assert torch.get_default_dtype() == torch.float32

# %% [markdown]
# ## 2. Dimensions and shapes (维度与尺寸)
#
# The number of dimensions is the number of nested brackets: a scalar is 0-D, a vector 1-D, a matrix 2-D, a colour
# image 3-D (channels, height, width), a batch of images or a video 4-D (frames, channels, height, width).
# `t.dim()` counts dimensions; `t.shape` (an attribute) and `t.size()` (a method) give the same `torch.Size`.

# %%
examples = {
    "scalar": torch.tensor(True),
    "vector": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "matrix": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    "RGB image (C, H, W)": torch.zeros(3, 32, 32),
    "video (T, C, H, W)": torch.zeros(16, 3, 32, 32),
}
for name, t in examples.items():
    assert t.shape == t.size()
    print(f"{name:20} dim={t.dim()} shape={tuple(t.shape)} numel={t.numel()}")

# %% [markdown]
# ### `view` and `reshape`, and contiguity (连续性)
#
# A tensor is a *view* on a flat block of memory (its storage) plus a shape and **strides**: how many elements to
# skip to move one step along each dimension. `view` changes shape and strides without copying, so it needs a
# compatible memory layout. `-1` lets PyTorch infer one dimension.

# %%
vector = torch.arange(12)
m34 = vector.view(3, 4)
m43 = vector.view(4, -1)
print(m34, m34.stride())
print(m43.shape, m43.stride())
assert m34.data_ptr() == vector.data_ptr()  # same memory, no copy

# %% [markdown]
# A transpose `t()` only swaps the strides, so the result is no longer contiguous (its rows are not adjacent in
# memory) and `view` refuses it. `reshape` works everywhere: it returns a view when it can and copies when it must
# (the same as `.contiguous().view(...)`).

# %%
m26 = torch.arange(12).view(2, 6)
m62 = m26.t()
print("strides", m26.stride(), "->", m62.stride(), "contiguous:", m62.is_contiguous())
try:
    m62.view(3, 4)
except RuntimeError as err:
    print("view failed:", type(err).__name__, "-", str(err).split(".")[0])
r = m62.reshape(3, 4)
print(r)
assert torch.equal(r, m62.contiguous().view(3, 4))
assert r.data_ptr() != m62.data_ptr()  # reshape had to copy here

# %% [markdown]
# ## 3. Tensors and NumPy: shared memory (共享内存)
#
# `torch.from_numpy(a)` and `t.numpy()` do not copy: the tensor and the array are two views of the same memory, so
# changing one changes the other. `clone()` makes an independent copy and breaks the link. (`torch.tensor(a)`
# always copies.)

# %%
arr = np.zeros(3)
t = torch.from_numpy(arr)
np.add(arr, 1, out=arr)  # change the array ...
print("array:", arr, " tensor:", t)  # ... and the tensor changed too
assert t.dtype == torch.float64  # NumPy's default float is float64, and from_numpy keeps it

t = torch.zeros(3)
linked, copied = t.numpy(), t.clone().numpy()
t.add_(1)  # the trailing underscore: an in-place method
print("tensor:", t, " .numpy():", linked, " .clone().numpy():", copied)
assert linked[0] == 1.0 and copied[0] == 0.0

# %% [markdown]
# `item()` turns a one-element tensor into a Python number, `tolist()` a tensor into nested lists.

# %%
s = torch.tensor(1.0).item()
lst = torch.tensor([[1, 2], [3, 4]]).tolist()
print(s, type(s).__name__, "|", lst, type(lst).__name__)
try:
    torch.tensor([1.0, 2.0]).item()
except RuntimeError as err:
    print("item() on 2 elements:", err)

# %% [markdown]
# ### In-place operations (原地操作)
#
# Methods ending in `_` (`add_`, `mul_`, `clamp_`, `zero_`) write into the tensor itself instead of returning a new
# one; `out=` does the same for functions. They save memory, but autograd sometimes needs the old values; notebook 03
# shows the error you then get.

# %%
a = torch.tensor([1.0, 2.0, 3.0])
ptr = a.data_ptr()
a.mul_(10).clamp_(max=25)
b = torch.empty(3)
torch.add(a, 1, out=b)
print(a, b)
assert a.data_ptr() == ptr

# %% [markdown]
# ## 4. Images: tensor ↔ PIL ↔ NumPy
#
# Image libraries store pixels as `uint8` in (height, width, channels) order; PyTorch models expect floats in
# (channels, height, width) order. `torchvision.transforms.v2.functional` converts between them; the notes' manual
# recipe (`permute(2, 0, 1)` and `/ 255`) gives the same numbers. The notes' `transforms.functional.to_tensor`
# still works but belongs to the old transforms API: `to_image` + `to_dtype(..., scale=True)` is today's version.

# %%
from PIL import Image
from torchvision.transforms.v2 import functional as TF

rng = np.random.default_rng(0)
hwc = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)  # a tiny 4x6 RGB picture
pil = Image.fromarray(hwc)
chw = TF.to_dtype(TF.to_image(pil), torch.float32, scale=True)  # PIL -> float tensor in [0, 1], (C, H, W)
manual = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255  # np.array copies: writable memory
back = TF.to_pil_image(chw)  # tensor -> PIL
print("PIL size (W, H):", pil.size, "mode", pil.mode, "| tensor", tuple(chw.shape), chw.dtype)
assert torch.allclose(chw, manual)
assert np.array_equal(np.asarray(back), hwc)  # the round trip is lossless
print("round trip tensor -> PIL -> numpy is exact:", np.array_equal(np.asarray(back), hwc))

# %% [markdown]
# ## 5. Broadcasting and matrix products (广播与矩阵乘法)
#
# Element-wise operations (`+`, `*`, `torch.mul`) **broadcast**: shapes are aligned from the right, and a dimension
# of size 1 (or a missing one) is stretched to match. Matrix products contract the last dimension of the first
# operand with the second-to-last of the second:
#
# | function | shapes | broadcasts? |
# |---|---|---|
# | `torch.mm(a, b)` | (m, n) @ (n, p) → (m, p) | no, 2-D only |
# | `torch.bmm(a, b)` | (b, m, n) @ (b, n, p) → (b, m, p) | no, 3-D only, same batch |
# | `torch.matmul(a, b)`, `a @ b` | (..., m, n) @ (..., n, p) → (..., m, p) | yes, over the leading dims |
# | `a * b`, `torch.mul` | element-wise | yes |

# %%
col, row = torch.arange(3).view(3, 1), torch.arange(4)
print("(3,1) + (4,) ->", tuple((col + row).shape))
print(col * 10 + row)
print("broadcast_shapes((2,1,3,4), (5,1,1)) =", tuple(torch.broadcast_shapes((2, 1, 3, 4), (5, 1, 1))))

a, b = torch.ones(2, 3), torch.ones(3, 4)
print("mm :", tuple(torch.mm(a, b).shape))
print("bmm:", tuple(torch.bmm(torch.ones(8, 2, 3), torch.ones(8, 3, 4)).shape))
a, b = torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2)  # the notes' example
c = torch.matmul(a, b)
print("matmul (2,1,3,4) @ (5,4,2) ->", tuple(c.shape))
assert c.shape == (2, 5, 3, 2) and torch.all(c == 4)  # every entry sums 4 products of ones
try:
    torch.mm(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2))
except RuntimeError as err:
    print("mm refuses >2-D:", err)

# %% [markdown]
# `matmul` with batch dimensions is the same as looping over the batch with `mm`: the batch dims `(2, 1)` and `(5,)`
# broadcast to `(2, 5)`.

# %%
a, b = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 2)
looped = torch.stack([torch.stack([a[i, 0] @ b[j] for j in range(5)]) for i in range(2)])
assert torch.allclose(a @ b, looped)
print("a @ b equals the loop of mm:", torch.allclose(a @ b, looped))

# %% [markdown]
# ## 6. Indexing, flipping and comparing
#
# Slicing works as in NumPy, except that **negative steps are not allowed** (`t[::-1]` raises). The notes reverse a
# dimension by indexing with a reversed `arange`; `torch.flip` says the same thing directly (both copy).

# %%
img = torch.arange(2 * 3 * 4).view(1, 2, 3, 4).float()  # N, C, H, W
try:
    img[..., ::-1]
except ValueError as err:
    print("t[..., ::-1]:", type(err).__name__, "-", err)
by_index = img[:, :, :, torch.arange(img.size(3) - 1, -1, -1)]
flipped = torch.flip(img, dims=[3])  # horizontal flip
assert torch.equal(by_index, flipped)
print(flipped[0, 0])

# %% [markdown]
# `torch.equal` asks "same shape and exactly the same values" — right for integers. For floats, rounding makes exact
# equality fragile: `torch.allclose` (and `torch.testing.assert_close`, which also explains a mismatch) compare with
# a tolerance.

# %%
x = torch.tensor([0.1, 0.2], dtype=torch.float64).sum()
y = torch.tensor(0.3, dtype=torch.float64)
print(f"0.1 + 0.2 = {x.item()!r}, 0.3 = {y.item()!r}")
print("equal:", torch.equal(x, y), "| allclose:", torch.allclose(x, y))
print("integers compare exactly:", torch.equal(torch.arange(3), torch.tensor([0, 1, 2])))
assert not torch.equal(x, y) and torch.allclose(x, y)
torch.testing.assert_close(x, y)  # passes silently; on a real mismatch it names the worst element

# %% [markdown]
# ## 7. `clone` versus `detach`
#
# | | new memory? | stays in the autograd graph? |
# |---|---|---|
# | `t.clone()` | yes | yes (gradients flow back through it) |
# | `t.detach()` | no, shares memory | no |
# | `t.detach().clone()` | yes | no — an independent snapshot |
#
# The notes write `tensor.detach.clone()()`, a typo for `tensor.detach().clone()`.

# %%
w = torch.tensor([1.0, 2.0], requires_grad=True)
c, d, snap = w.clone(), w.detach(), w.detach().clone()
print("clone :", c.requires_grad, c.grad_fn.__class__.__name__, "shares memory:", c.data_ptr() == w.data_ptr())
print("detach:", d.requires_grad, d.grad_fn, "shares memory:", d.data_ptr() == w.data_ptr())
(c * 3).sum().backward()
print("gradient through clone:", w.grad)
with torch.no_grad():
    w.add_(10)
print("after changing w: detach sees", d, "| snapshot keeps", snap)
assert torch.equal(d, w.detach()) and torch.equal(snap, torch.tensor([1.0, 2.0]))

# %% [markdown]
# ## 8. Naming dimensions: einops instead of named tensors
#
# The notes show *named tensors*: `torch.randn(32, 3, 56, 56, names=('N', 'C', 'H', 'W'))`, `images.sum('C')` and
# `align_to`. That prototype feature is **gone from PyTorch 2.14**: `names=` is no longer accepted.

# %%
try:
    torch.randn(32, 3, 56, 56, names=("N", "C", "H", "W"))
except TypeError as err:
    print("names= ->", type(err).__name__, "-", str(err).splitlines()[0])
print("Tensor.align_to exists:", hasattr(torch.Tensor, "align_to"))

# %% [markdown]
# The notes also recommend [einops](https://einops.rocks) ("贼强": very strong), and it is the better tool: the names
# live in a readable pattern string, every operation checks the shapes it is given, and it works on any tensor.
# `rearrange` reorders/merges/splits axes, `reduce` sums or averages over named axes, `repeat` tiles.

# %%
from einops import rearrange, reduce, repeat

images = torch.randn(32, 3, 56, 56)
per_channel_sum = reduce(images, "n c h w -> n h w", "sum")  # the notes' images.sum('C')
assert torch.allclose(per_channel_sum, images.sum(dim=1))
nhwc = rearrange(images, "n c h w -> n h w c")  # the notes' align_to, for channels-last
patches = rearrange(images, "n c (h p1) (w p2) -> n (h w) (p1 p2 c)", p1=14, p2=14)  # ViT-style patches
pooled = reduce(images, "n c (h 2) (w 2) -> n c h w", "max")  # 2x2 max pooling
tiled = repeat(torch.arange(3), "c -> n c", n=2)
for name, t in [("sum over c", per_channel_sum), ("channels last", nhwc), ("patches", patches), ("max pool", pooled)]:
    print(f"{name:14} {tuple(t.shape)}")
print(tiled)
assert torch.equal(pooled, torch.nn.functional.max_pool2d(images, 2))
try:
    rearrange(images, "n c h w -> n (c h w) x")
except Exception as err:  # einops.EinopsError
    print(type(err).__name__, "-", str(err).splitlines()[-1])

# %% [markdown]
# ## 9. Devices (设备)
#
# A tensor lives on one device; operations need their operands on the same device. `utils.get_device()` picks CUDA,
# then Apple's MPS, then the CPU (set `TORCH_COURSE_DEVICE=cpu` to force the CPU). `.to(device)` copies a tensor
# there (and returns the tensor itself if it is already there); results come back with `.cpu()` before `.numpy()`.
# The tests of this course run on the CPU; on a GPU machine the same cells run on `cuda`.

# %%
device = get_device()
x = torch.arange(4.0)
y = x.to(device)
z = (y * 2).cpu().numpy()
print("computed on", device.type, "->", z)
assert x.to("cpu") is x  # no copy when it is already there
if device.type != "cpu":
    try:
        x + y
    except RuntimeError as err:
        print("mixing devices:", str(err).split(".")[0])
else:
    print("On a GPU, x + y would fail here: 'Expected all tensors to be on the same device'")

# %% [markdown]
# ## Summary
#
# - A tensor has a `dtype` (inferred: ints → `int64`, floats → `float32`), a `shape`, strides and a device.
#   Build tensors with `torch.tensor(data)`, not the legacy `torch.IntTensor(n)`, which allocates garbage.
# - `view` needs a compatible memory layout; `reshape` always works and copies only when it must.
# - `from_numpy`/`.numpy()` share memory; `clone()` copies. `detach()` leaves the graph but shares memory.
# - Broadcasting aligns shapes from the right; `mm` is 2-D, `bmm` is batched 3-D, `matmul`/`@` broadcasts.
# - No negative-step slicing: use `torch.flip`. Compare floats with `allclose`/`assert_close`.
# - Named tensors are gone: name dimensions with einops patterns.
# - Move data with `.to(device)`; pick the device once with `get_device()`.
#
# Next: **02 · autograd** — how PyTorch computes gradients.
