"""Checks for the exercises of notebook 04 · MNIST and CNNs (``notebooks/src/04_mnist_cnn.py``).
Used by notebook 04, whose ``Checker("04")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import copy
import functools
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from utils.exercises import Registry, expect, hint, returns, shape_answer
from utils.exercises.rules import autograd_runs

EXERCISES = Registry("04")

LOADER = "3. The data pipeline, part 2: `DataLoader` and `collate_fn` turn samples into batches"
SAMPLERS = "4. The data pipeline, part 3: samplers choose the indices"
CONV = "10. Convolutions, layers and two classic MNIST models"
SOFTMAX = "11. Softmax, cross-entropy, and a softmax too many"
STEP = "12. The course model and one training step by hand"
LOOP = "13. The training loop, written out"
ACCUMULATE = "02 · 4. The graph is freed; gradients accumulate"


@EXERCISES.exercise(1, "Predict shapes and the parameter count (predict)", CONV)
def shapes_and_parameters(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 3,
        "give a list of three values: [shape after net[0], shape after Flatten, number of parameters]",
    )
    a, b, n = answer
    a, b = shape_answer(a, "the first value", "(32, 8, 5, 5)"), shape_answer(b, "the second value", "(32, 8, 5, 5)")
    expect(isinstance(n, int) and not isinstance(n, bool), "the number of parameters is an int")
    # After the first convolution: (N, C, H, W) with H = W = floor((28 + 2*1 - 5) / 2) + 1 = 13.
    if len(a) == 3:
        hint("the first shape has lost the batch dimension: a convolution keeps it, (N, C, H, W)")
    expect(len(a) == 4, f"a convolution returns (N, C, H, W), four numbers, not {len(a)}")
    expect(
        a[:2] == (32, 8), "the first shape starts with the batch size 32 and the 8 output channels of Conv2d(1, 8, ...)"
    )
    side = a[2:]
    if side == (12, 12):
        hint("after net[0]: padding=1 adds one zero on each side, so the formula reads n + 2p - k with p = 1")
    if side == (14, 14):
        hint(
            "after net[0]: (28 + 2 - 5) / 2 = 12.5 is rounded *down* (a kernel position must fit in the image), "
            "then 1 is added"
        )
    if side in ((26, 26), (24, 24)):
        hint("after net[0]: stride=2 moves the kernel two pixels per step: divide by s before adding 1")
    expect(side == (13, 13), f"after net[0]: use floor((n + 2p - k) / s) + 1 with n=28, k=5, s=2, p=1, not {side}")
    # What Flatten gives: 13 -pool-> 6 (rounded down) -conv3-> 4, times 16 channels.
    if b == (32, 400):
        hint("MaxPool2d(2) on 13 gives 6, rounded down (the last row and column are dropped), not 7")
    if b in ((32, 16, 4, 4), (32, 16)):
        hint("nn.Flatten merges every dimension after the batch: channels × height × width")
    if b in ((8192,), (256,), (1, 8192)):
        hint("nn.Flatten keeps the batch dimension (start_dim=1): one row of features per image")
    expect(
        b == (32, 256),
        f"the shape after Flatten should be (batch, channels × height × width), not {b}: follow "
        "13 through the pooling and the second convolution",
    )
    # Parameters: 8·1·5·5 + 8, then 16·8·3·3 (no bias), 2·16 for BatchNorm, 256·10 + 10.
    if n == 3962 + 16:
        hint("the second convolution has bias=False: no 16 biases", STEP)
    if n == 3962 - 32:
        hint("BatchNorm2d(16) has parameters too: a scale γ and a shift β per channel, 2 × 16", STEP)
    if n in (3962 + 32, 3962 + 33):
        hint(
            "BatchNorm's running mean and variance (and its step counter) are buffers, not parameters: they are in "
            "state_dict() but not in parameters(), and the optimizer never changes them",
            LOOP,
        )
    if n == 3962 - 8 or n == 3962 - 10:
        hint("a layer has a bias unless bias=False: the first convolution's 8 and the Linear layer's 10 count")
    if n == 3962 - 16 * 8 * 9 + 16 * 9:
        hint("a Conv2d(c_in, c_out, k) kernel spans all input channels: c_out × c_in × k × k weights")
    expect(
        n == 3962,
        f"{n} parameters is not right: add c_out·c_in·k² (+ c_out biases) per convolution, 2·C for "
        "BatchNorm and in·out + out for the Linear layer, with in = the features per image after Flatten",
    )


def _classifier(seed: int, n_in: int, n_classes: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(n_in, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, n_classes))
    with torch.no_grad():  # running statistics as after some training, far from the batches' own
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.train()  # as a model is after a training epoch


def _labels(logits: torch.Tensor, right: list[bool], n_classes: int) -> torch.Tensor:
    """Labels that the eval-mode model gets right exactly where ``right`` says."""
    pred = logits.argmax(1)
    return torch.where(torch.tensor(right), pred, (pred + 1) % n_classes)


def _number(value, what: str) -> float:
    if isinstance(value, torch.Tensor):
        hint(f"{what} is a tensor: return a Python number with `.item()` (section 13 sums `loss.item()`)")
    expect(isinstance(value, (int, float)) and not isinstance(value, bool), f"{what} should be a Python float")
    return float(value)


@EXERCISES.exercise(2, "Evaluate a classifier (write a function)", LOOP)
def evaluate_classifier(fn):
    cases = [  # (seed, samples, features, classes, batch size, which samples the model gets right)
        (0, 10, 6, 3, 4, [True, True, True, False, True, True, False, True, True, False]),  # batches 4, 4, 2
        (1, 7, 5, 4, 3, [False, True, True, True, False, True, True]),  # batches 3, 3, 1
    ]
    for seed, n, n_in, n_classes, batch_size, right in cases:
        model = _classifier(seed, n_in, n_classes)
        x = torch.randn(n, n_in, generator=torch.Generator().manual_seed(seed + 10))
        reference = copy.deepcopy(model).eval()
        with torch.no_grad():
            logits = reference(x)
        y = _labels(logits, right, n_classes)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
        expected_loss = F.cross_entropy(logits, y).item()
        expected_acc = sum(right) / n
        batches = [(logits[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]

        calls = []  # (modules in training mode, grad mode, batch size) of every forward pass of the model
        handle = model.register_forward_hook(
            lambda m, i, o, calls=calls: calls.append(
                (
                    (m.training, sorted({type(sub).__name__ for sub in m.modules() if sub.training and sub is not m})),
                    torch.is_grad_enabled(),
                    len(i[0]),
                )
            )
        )
        grad_mode = torch.is_grad_enabled()
        try:
            result = returns(fn, model, loader)
        finally:
            handle.remove()
            left_off = torch.is_grad_enabled() != grad_mode
            torch.set_grad_enabled(grad_mode)  # the learner's kernel gets its grad mode back
        if left_off:
            hint(
                "your function switched gradient recording off for the whole kernel and left it off "
                "(`torch.set_grad_enabled(False)` as a statement, say): every training step run afterwards would "
                "silently compute no gradients. Use `with torch.no_grad():` or `@torch.no_grad()`, which switch it "
                "back on when the evaluation ends"
            )
        frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
        if frozen:
            hint(
                f"your function set `requires_grad=False` on the model's parameters (`{frozen[0]}`, ...): that changes "
                "the model, and the next training step would leave them unchanged. `torch.no_grad()` stops autograd "
                "from recording while leaving the parameters as they are"
            )
        if calls and max(size for _, _, size in calls) > batch_size:
            hint(
                f"the model ran on {max(size for _, _, size in calls)} samples in one forward pass, more than the "
                f"loader's batches of {batch_size}: you joined the batches together. On a real test set that is one "
                "huge forward pass that may not fit in memory, the reason a loader hands out batches. Run the model "
                "on each batch and add up the losses and the right predictions as you go"
            )
        if calls and max(size for _, _, size in calls) < min(batch_size, n):
            hint(
                f"the model never ran on a whole batch of the loader ({batch_size} samples): it ran on "
                f"{max(size for _, _, size in calls)} at most. Evaluate batch by batch, as the loader hands them out: "
                "one forward pass per batch is what makes evaluation fast, and the loader (not `loader.dataset`) "
                "decides the batches"
            )
        expect(isinstance(result, (tuple, list)) and len(result) == 2, "return a pair: (mean loss, accuracy)")
        training = sorted({name for (_, names), _, _ in calls for name in names})
        top = any(flag for (flag, _), _, _ in calls)
        if training or top:
            training = [name for name in training if "Norm" in name or "Dropout" in name]  # layers the mode changes
            effects = []
            if any(name.startswith("BatchNorm") for name in training):
                effects.append("BatchNorm normalised with each batch's own statistics")
            if any(name.startswith("Dropout") for name in training):
                effects.append("Dropout zeroed values at random")
            hint(
                (f"its {' and '.join(training)} ran in training mode" if training else "the model ran in training mode")
                + (f" ({' and '.join(effects)})" if effects else "")
                + ". Call `model.eval()` before evaluating: it switches every submodule to evaluation mode"
                + ("" if top else "; setting `model.training` or a few layers' mode by hand does not")
            )
        if any(grad for _, grad, _ in calls):
            hint(
                "the forward passes recorded a graph: evaluate inside `with torch.no_grad():` (or decorate the "
                "function with `@torch.no_grad()`). `model.eval()` alone does not stop recording"
            )
        loss, acc = _number(result[0], "the loss"), _number(result[1], "the accuracy")
        # Accuracy to 1e-6: `(pred == yb).float().mean().item()` is a float32 fraction (0.6999999881 for 7 of 10).
        if abs(loss - expected_loss) < 1e-5 and abs(acc - expected_acc) < 1e-6:
            continue
        if abs(acc - 100 * expected_acc) < 1e-4:
            hint("the accuracy is a percentage: return the fraction of right predictions, between 0 and 1")
        mean_of_means = sum(F.cross_entropy(lg, yb).item() for lg, yb in batches) / len(batches)
        if abs(loss - mean_of_means) < 1e-5 and abs(loss - expected_loss) >= 1e-5:
            hint(
                "the loss is the mean of the batches' mean losses, but the last batch is smaller: weight each "
                "batch's loss by its size (`loss.item() * len(yb)`) and divide by the number of samples"
            )
        batch_acc = sum((lg.argmax(1) == yb).float().mean().item() for lg, yb in batches) / len(batches)
        if abs(loss - expected_loss) < 1e-5 and abs(acc - batch_acc) < 1e-6:
            hint(
                "the accuracy is the mean of the batches' accuracies, but the last batch is smaller: count the "
                "right predictions over all batches, then divide by the number of samples"
            )
        padded = len(batches) * batch_size  # len(loader) * loader.batch_size counts the last batch as full
        if abs(loss - expected_loss * n / padded) < 1e-5 or (
            abs(loss - expected_loss) < 1e-5 and abs(acc - expected_acc * n / padded) < 1e-6
        ):
            hint(
                f"you divided by len(loader) × batch_size = {padded}, but the last batch is smaller: there are {n} "
                "samples. Count them as you go (`len(yb)`), or use `len(loader.dataset)`"
            )
        if abs(loss - sum(F.cross_entropy(lg, yb).item() for lg, yb in batches) / n) < 1e-5:
            hint(
                "you added the batches' *mean* losses and divided by the number of samples: multiply each batch's "
                'mean by its size first (`loss.item() * len(yb)`), or sum with `reduction="sum"`'
            )
        smoothed = F.cross_entropy(logits, y, label_smoothing=0.1).item()
        if abs(loss - smoothed) < 1e-5:
            hint(
                "that is the loss with label smoothing 0.1, section 13's `loss_fn`: the exercise asks for plain "
                "`F.cross_entropy(logits, yb)`"
            )
        softmaxed = F.cross_entropy(logits.softmax(1), y).item()
        if abs(loss - softmaxed) < 1e-5 and abs(loss - expected_loss) >= 1e-5:
            hint(
                "the loss was computed on softmax outputs: `F.cross_entropy` takes the logits and applies "
                "log_softmax itself",
                SOFTMAX,
            )
        if abs(loss - expected_loss * n) < 1e-4:
            hint("the loss is the sum over all samples: divide by the number of samples")
        expect(
            abs(loss - expected_loss) < 1e-5,
            f"the mean loss per sample is not {loss:.4f}: `F.cross_entropy(logits, yb)` is the batch's mean, and "
            "the loss asked for is the mean over all the samples of all the batches",
        )
        expect(
            abs(acc - expected_acc) < 1e-6,
            f"the accuracy is not {acc:.4f}: it is the fraction of all the samples whose largest logit is at "
            "the right class",
        )


@functools.cache
def _mnist_test() -> tuple[torch.Tensor, torch.Tensor]:
    """The MNIST test set's images (uint8 [10000, 28, 28]) and labels, loaded as section 1 loads them."""
    from utils.data import load_mnist  # imports torchvision: only when this exercise is checked

    test = load_mnist(train=False)
    return test.data, test.targets


class _Digits(Dataset):
    """Section 2's DigitImages, which also returns each sample's index (to check what the sampler chose)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].unsqueeze(0), int(self.labels[i]), i


def _rng_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _same_states(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def _epoch(loader: DataLoader, n: int, classes: list[int], per_class: int) -> list[list[int]]:
    """One epoch of ``loader``: the indices of each batch, after checking each batch's labels and indices."""
    batches = [(labels, indices) for _, labels, indices in loader]
    for b, (labels, _) in enumerate(batches):
        strays = sorted(set(labels.tolist()) - set(classes))
        expect(not strays, f"a batch holds digits {strays} that do not occur in `labels`")
        counts = {c: int((labels == c).sum()) for c in classes}
        if all(v == per_class for v in counts.values()):
            continue
        if b == len(batches) - 1 and all(v <= per_class for v in counts.values()):
            hint(
                f"the last batch holds {len(labels)} samples, not {per_class} of each of the {len(classes)} digits: "
                "when the rarest digit has fewer than `per_class` images left, the epoch ends (the leftovers are "
                "dropped, as `drop_last=True` drops them)",
                LOADER,
            )
        hint(
            f"a batch holds {counts} images of each digit, not {per_class} of each: "
            "`WeightedRandomSampler` and shuffling balance the digits only on average. Every batch must hold "
            "exactly `per_class` of every digit, by construction, not by chance"
        )
    flat = [i for _, indices in batches for i in indices.tolist()]
    expect(all(0 <= i < n for i in flat), f"an index is outside the data set (0 to {n - 1})")
    if len(set(flat)) < len(flat):
        hint(
            "an index came twice in one epoch: an epoch reads each image at most once. Shuffle each digit's "
            "indices once per epoch (a permutation, `torch.randperm`) and take them in turn, without replacement"
        )
    return [indices.tolist() for _, indices in batches]


@EXERCISES.exercise(3, "A batch sampler with every digit in every batch (write a class)", SAMPLERS)
def every_digit_batches(cls):
    expect(isinstance(cls, type), "give the class itself, `EveryDigitBatches`, not an instance of it")
    iter(cls(torch.tensor([0, 1, 1, 0]), 1, torch.Generator().manual_seed(0)))  # an untouched stub stops here
    images, targets = _mnist_test()
    pick = torch.nonzero((targets == 2) | (targets == 5) | (targets == 7)).squeeze(1)[:1200]
    cases = [  # (dataset, its labels, per_class): the whole test set; 1200 images of three digits only
        (_Digits(images, targets), targets, 8),
        (_Digits(images[pick], targets[pick]), targets[pick], 5),
    ]
    for dataset, labels, per_class in cases:
        classes = labels.unique().tolist()
        rarest = min(int((labels == c).sum()) for c in classes)
        expected = rarest // per_class

        def epochs(seed: int, count: int = 1, dataset=dataset, labels=labels, per_class=per_class, classes=classes):
            sampler = cls(labels.clone(), per_class, torch.Generator().manual_seed(seed))
            # the loader's own generator: without one, each epoch would draw a worker seed from the global one
            loader = DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator().manual_seed(seed))
            return [_epoch(loader, len(dataset), classes, per_class) for _ in range(count)], loader.batch_sampler

        states = _rng_states()
        (first, second), sampler = epochs(0, count=2)
        global_rng = not _same_states(states, _rng_states())
        try:
            n_batches = len(sampler)
        except TypeError as err:
            hint(
                f"`len(sampler)` fails ({str(err).splitlines()[0]}): `len(loader)`, the number of steps per epoch, "
                "needs the batch sampler's `__len__`",
            )
        if len(first) != expected:
            hint(
                f"one epoch yielded {len(first)} batches, but the rarest of the digits {classes} has {rarest} "
                f"images here: {expected} batches of {per_class} of each digit"
            )
        expect(
            n_batches == expected,
            f"`len(sampler)` is {n_batches!r}, but an epoch yields {expected} batches: `__len__` must say how many "
            "batches `__iter__` yields",
        )
        if global_rng:
            hint(
                "the sampler drew from a global random generator (`torch.randperm` or `random.shuffle` without "
                "the `generator` it was given): the order then depends on everything else the program drew. Pass "
                "the generator the sampler was given (`generator=...`) to every `torch.randperm`",
                LOADER,
            )
        if first == second:
            hint(
                "the second epoch repeats the first one's batches: draw the permutations in `__iter__`, which runs "
                "once per epoch (not once in `__init__`), and let the generator go on from where the previous "
                "epoch left it (re-seeding it there starts every epoch alike)",
                LOADER,
            )
        if {frozenset(b) for b in first} == {frozenset(b) for b in second}:
            hint(
                "the second epoch puts the same samples together in a batch as the first, only in another "
                "order: a new epoch must make new batches, or the model sees the same groups (and the same "
                "batch statistics) every epoch. Shuffle each digit's indices anew in every `__iter__`, before "
                "they are cut into batches",
                LOADER,
            )
        if epochs(0)[0][0] != first or epochs(1)[0][0] == first:
            hint(
                "the order does not follow the generator: two samplers given generators seeded alike must give the "
                "same batches, and another seed other batches. Draw every permutation from the `generator` given",
                LOADER,
            )


def _tiny_cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, softmax: bool = False) -> list[torch.Tensor]:
    logits = model(x)
    loss = F.cross_entropy(logits.softmax(1) if softmax else logits, y)
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def _combine(*terms):
    """Sum of weighted gradient lists: _combine((w1, g1), (w2, g2), ...)."""
    return [sum(w * g[i] for w, g in terms) for i in range(len(terms[0][1]))]


@EXERCISES.exercise(4, "Gradient accumulation (stretch)", STEP)
def accumulation_step(fn):
    lr = 0.5
    for seed, sizes in ((0, (5, 3, 4)), (1, (2, 6))):
        model = _tiny_cnn(seed)
        initial = copy.deepcopy(model)  # the model before the step, for the references
        g = torch.Generator().manual_seed(seed + 20)
        x, y = torch.randn(sum(sizes), 1, 6, 6, generator=g), torch.randint(0, 3, (sum(sizes),), generator=g)
        micro = list(zip(x.split(list(sizes)), y.split(list(sizes))))
        k, n = len(sizes), sum(sizes)
        with torch.no_grad():
            expected_loss = F.cross_entropy(initial(x), y).item()
            softmax_loss = F.cross_entropy(initial(x).softmax(1), y).item()
            means = [F.cross_entropy(initial(xb), yb).item() for xb, yb in micro]
        full, full_softmax = _grads(initial, x, y), _grads(initial, x, y, softmax=True)
        parts = [_grads(initial, xb, yb) for xb, yb in micro]
        before = [p.detach().clone() for p in initial.parameters()]
        stale = [torch.full_like(p, 0.3) for p in before]  # gradients left in .grad by a previous step

        for p, s in zip(model.parameters(), stale):
            p.grad = s.clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        steps, forwards = [0], []  # optimizer steps; (autograd runs so far, batch size) of each recording forward
        seen = []  # the batch size of every forward pass, recording or not

        with autograd_runs() as runs:

            def count_step(opt, args, kwargs, steps=steps):
                steps[0] += 1

            def note_forward(module, inputs, forwards=forwards, runs=runs, seen=seen):
                seen.append(len(inputs[0]))
                if torch.is_grad_enabled():
                    forwards.append((runs[0], len(inputs[0])))

            hooks = [optimizer.register_step_post_hook(count_step), model.register_forward_pre_hook(note_forward)]
            try:
                loss = returns(fn, model, micro, optimizer)
            finally:
                for h in hooks:
                    h.remove()
        after = [p.detach() for p in model.parameters()]
        if steps[0] > 1:
            hint(
                f"`optimizer.step()` ran {steps[0]} times for {k} micro-batches: a step per micro-batch is ordinary "
                "small-batch training, each step on a few samples' gradient. Accumulation adds up the gradients "
                "of all the micro-batches first: call `optimizer.step()` once, after the loop",
                ACCUMULATE,
            )
        if steps[0] == 0:
            if not all(torch.equal(a, b) for a, b in zip(after, before)):
                hint(
                    "the parameters changed but `optimizer.step()` never ran: you updated them by hand. Call "
                    "`optimizer.step()`: the function must work with any optimizer (AdamW keeps moment estimates "
                    "and weight decay that a hand-written SGD update leaves out)"
                )
            hint("`optimizer.step()` never ran: after the backward passes, one step applies the accumulated gradient")

        def moved_by(grads, after=after, before=before):  # did plain SGD move the parameters by -lr * grads?
            return all(torch.allclose(a, b - lr * d, rtol=1e-4, atol=1e-5) for a, b, d in zip(after, before, grads))

        if not moved_by(full):
            if moved_by([torch.zeros_like(p) for p in before]):
                hint(
                    "the parameters did not change: no gradient reached the update. Call `optimizer.step()` once, "
                    "after the backward passes, and call `backward()` on a loss still attached to the model's graph "
                    "(not on a number made with `.item()` or `.detach()`)",
                    ACCUMULATE,
                )
            if moved_by(full_softmax):
                hint(
                    "the loss was computed on softmax outputs: `F.cross_entropy` takes the logits and applies "
                    "log_softmax itself",
                    SOFTMAX,
                )
            if moved_by(_combine((n, full))):
                hint(
                    f"the update is {n} times too large, the number of samples: a loss summed over the samples "
                    '(`reduction="sum"`) must be divided by their total to give the mean',
                    ACCUMULATE,
                )
            if moved_by(_combine((1, full), (1, stale))):
                hint(
                    "the step used the previous step's gradients too: `.grad` accumulates until you clear it, so "
                    "call `optimizer.zero_grad()` once, before the first micro-batch",
                    ACCUMULATE,
                )
            if moved_by(_combine(*[(1, p) for p in parts])):
                hint(
                    "the step used the sum of the micro-batches' mean gradients, too large: the loss is a mean, so "
                    "scale each micro-batch's loss by its share of the samples, len(x) / total",
                    ACCUMULATE,
                )
            if moved_by(_combine(*[(1 / k, p) for p in parts])):
                hint(
                    "dividing each loss by the number of micro-batches is right only when they have the same size: "
                    "these do not, so weight each one by len(x) / total",
                    ACCUMULATE,
                )
            for w in (sizes[-1] / n, 1 / k, 1):
                if moved_by(_combine((w, parts[-1]))):
                    hint(
                        "only the last micro-batch's gradient reached the step: `zero_grad()` inside the loop "
                        "throws away the gradients accumulated so far. Clear once, before the loop",
                        ACCUMULATE,
                    )
            if moved_by(_one_step_per_micro_batch(initial, micro, lr)):
                hint(
                    "that is one step per micro-batch (ordinary small-batch training), not one step for all of "
                    "them: call `optimizer.step()` once, after the loop"
                )
            hint(
                "the update differs from one SGD step on all the micro-batches together: the accumulated gradient "
                "should be the gradient of the mean loss over all the samples",
                ACCUMULATE,
            )
        largest = max(sizes)
        if max(size for _, size in forwards) > largest:
            hint(
                f"the model ran on {max(size for _, size in forwards)} samples in one forward pass, but the largest "
                f"micro-batch has {largest}: you joined the micro-batches into one batch. The update is right, but "
                "accumulation exists because the big batch does not fit in memory: run a forward and a backward "
                "pass on each micro-batch",
                ACCUMULATE,
            )
        if max(seen) > largest:
            hint(
                f"the model ran on {max(seen)} samples in one forward pass without recording a graph, but the "
                f"largest micro-batch has {largest}: you joined the micro-batches to compute the returned loss. "
                "Without a graph that still holds a whole batch's activations at once, the memory accumulation "
                "saves. Add up each micro-batch's share of the loss from the forward passes that made the "
                "gradients",
                ACCUMULATE,
            )
        if any(a == b for (a, _), (b, _) in zip(forwards, forwards[1:])):
            hint(
                "two forward passes ran before a backward pass: the first micro-batch's graph (all its "
                "activations) was still in memory while the second was built, so memory grows with the number "
                "of micro-batches. Call `backward()` on each micro-batch's share of the loss before the next "
                "forward pass: backward frees the graph it used",
                ACCUMULATE,
            )
        loss = _number(loss, "the returned loss")
        if abs(loss - expected_loss) < 1e-5:
            continue
        if abs(loss - softmax_loss) < 1e-5:
            hint("the returned loss was computed on softmax outputs: `F.cross_entropy` takes the logits", SOFTMAX)
        if abs(loss - sum(means) / k) < 1e-5:
            hint("the returned loss is the mean of the micro-batches' means: weight each by its size")
        if abs(loss - sum(means)) < 1e-5:
            hint("the returned loss is the sum of the micro-batches' means: weight each by len(x) / total")
        if abs(loss - means[-1]) < 1e-5:
            hint("the returned loss is the last micro-batch's: return the mean loss over all the samples")
        with torch.no_grad():
            after_step = F.cross_entropy(model(x), y).item()
        if abs(loss - after_step) < 1e-5:
            hint(
                "the returned loss was computed after the update, with a forward pass of its own: return the loss "
                "of the forward passes that made the gradients, before `optimizer.step()` (add up each "
                "micro-batch's share as you go)"
            )
        hint(
            f"the returned loss is not {loss:.4f}: it should be the mean loss per sample over all the "
            "micro-batches, before the step"
        )


def _one_step_per_micro_batch(initial: nn.Module, micro, lr: float) -> list[torch.Tensor]:
    """The parameters' change, as a "gradient" (change / -lr), after one plain SGD step per micro-batch."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for xb, yb in micro:
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    return [(s.detach() - p.detach()) / lr for s, p in zip(initial.parameters(), model.parameters())]
