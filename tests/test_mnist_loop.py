"""Notebook 04's training loop (``train_steps`` and ``evaluate``, section 13) on bad input: run from the
notebook's own cell by :mod:`tools.lesson_code`, on a tiny model and random data (no MNIST)."""

import math

import pytest
import torch
import torch.nn as nn

from tools.lesson_code import load

lesson = load("04_mnist_cnn")


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10)
    batches = [(torch.randn(32, 1, 4, 4), torch.randint(0, 10, (32,))) for _ in range(4)]
    return model, optimizer, scheduler, batches


def test_training_stops_at_the_first_nan_batch_before_the_update():
    model, optimizer, scheduler, batches = _setup()
    batches[2][0][5, 0, 1, 1] = float("nan")  # one pixel of one image of the third batch
    with pytest.raises(
        FloatingPointError,
        match=r"training step 3 \(batch 2 of this call\): the loss is nan; "
        r"its input holds 1 NaN or infinite value\(s\): check the data",
    ):
        lesson.train_steps(model, batches, optimizer, scheduler)
    assert scheduler.last_epoch == 2  # two steps were taken, the NaN batch's was not
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # but the forward pass in train mode has already put the batch into BatchNorm's running statistics
    assert model[2].running_mean.isnan().all()


def test_evaluation_after_a_nan_batch_blames_the_model_not_the_learning_rate():
    model, optimizer, scheduler, batches = _setup()
    batches[1][0][0, 0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError):
        lesson.train_steps(model, batches, optimizer, scheduler)
    with pytest.raises(
        FloatingPointError,
        match=r"evaluation batch 0: the loss is nan; its input is finite, but the "
        r"model holds NaN or infinity in 2\.running_mean, 2\.running_var: "
        r"rebuild it",
    ):
        lesson.evaluate(model, batches[:1])  # a clean batch: the NaN comes from the running statistics


def test_training_names_a_divergence_when_the_input_is_finite():
    model, optimizer, scheduler, batches = _setup()
    with torch.no_grad():
        model[1].weight.fill_(float("inf"))  # as after a diverged update
    with pytest.raises(
        FloatingPointError,
        match=r"batch 0 of this call\): the loss is nan; its input is finite, "
        r"but the model holds NaN or infinity in 1\.weight",
    ):
        lesson.train_steps(model, batches, optimizer, scheduler)


def test_evaluate_refuses_nan_outputs():
    model, _, _, batches = _setup()
    batches[1][0][0, 0, 0, 0] = float("inf")
    # argmax of a row with a NaN is the NaN's position: without the check this returned an accuracy
    with pytest.raises(FloatingPointError, match=r"evaluation batch 1: the loss is nan; its input holds 1 NaN"):
        lesson.evaluate(model, batches)
    loss, accuracy = lesson.evaluate(model, batches[:1])  # the finite batch alone passes the check
    assert math.isfinite(loss) and 0 <= accuracy <= 1


def test_training_refuses_an_optimizer_of_another_model():
    model, _, _, batches = _setup()
    stale, optimizer, scheduler, _ = _setup()  # as after re-running the cell that builds the model, not the optimizer
    with pytest.raises(
        ValueError,
        match="the optimizer holds parameters that are not this model's.*and the scheduler from that optimizer",
    ):  # a stale scheduler would drive the old one
        lesson.train_steps(model, batches, optimizer, scheduler)
    # an optimizer over part of the model (fine-tuning the last layer) is fine
    head_only = torch.optim.SGD(model[4].parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(head_only, lambda step: 1.0)
    before = model[1].weight.clone()
    lesson.train_steps(model, batches, head_only, sched)
    assert torch.equal(model[1].weight, before) and stale is not model


def test_b16_batches_that_are_not_pairs_and_empty_loaders_are_named():
    """Probe B16: 3-tuples as batches, and a loader without batches (train_steps and evaluate)."""
    model, optimizer, scheduler, batches = _setup()
    triples = [(xb, yb, torch.arange(len(yb))) for xb, yb in batches]
    with pytest.raises(ValueError, match=r"batch 0 of batches is a tuple of 3 items; each batch must be a pair"):
        lesson.train_steps(model, triples, optimizer, scheduler)
    with pytest.raises(ValueError, match=r"batch 0 of loader is a tuple of 3 items; each batch must be a pair"):
        lesson.evaluate(model, triples)
    with pytest.raises(ValueError, match=r"batches yielded no batch: is its dataset empty"):
        lesson.train_steps(model, [], optimizer, scheduler)
    with pytest.raises(ValueError, match=r"loader yielded no batch"):
        lesson.evaluate(model, iter([]))
