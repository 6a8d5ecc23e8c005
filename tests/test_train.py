"""Tests of utils.train on a tiny synthetic problem (fast, CPU only)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from utils.data import tensor_loader
from utils.train import History, evaluate, fit, predict, train_one_epoch


def _blobs(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well-separated Gaussian blobs in 2-D: a linear model classifies them perfectly."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centers = torch.tensor([[4.0, 0.0], [-4.0, 4.0], [-4.0, -4.0]])
    return centers[y] + 0.5 * torch.randn(n, 2, generator=g), y


@pytest.fixture
def setup():
    torch.manual_seed(0)
    x, y = _blobs()
    model = nn.Linear(2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = tensor_loader(x, y, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    return model, opt, loader, x, y


def test_fit_learns_and_records_history(setup):
    model, opt, loader, x, y = setup
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=3 * len(loader))
    seen = []
    hist = fit(model, loader, opt, nn.CrossEntropyLoss(), "cpu", epochs=3, scheduler=sched,
               val_loader=tensor_loader(x, y, batch_size=100),
               on_epoch_end=lambda epoch, m: seen.append((epoch, sorted(m))), progress=False)
    assert isinstance(hist, History)
    assert all(len(v) == 3 for v in hist.as_dict().values())
    assert set(hist.as_dict()) == {"train_loss", "train_acc", "val_loss", "val_acc", "lr", "seconds", "samples_per_s"}
    assert hist.train_loss[-1] < hist.train_loss[0]
    assert hist.val_acc[-1] >= 0.98
    assert [e for e, _ in seen] == [1, 2, 3]
    assert seen[0][1] == ["lr", "samples_per_s", "seconds", "train_acc", "train_loss", "val_acc", "val_loss"]
    assert sched.last_epoch == 3 * len(loader)  # stepped once per batch, exactly


def test_train_one_epoch_metrics_and_max_batches(setup):
    model, opt, loader, _, _ = setup
    m = train_one_epoch(model, loader, opt, nn.CrossEntropyLoss(), torch.device("cpu"), max_batches=2, progress=False)
    assert m["samples"] == 64.0
    assert 0.0 <= m["accuracy"] <= 1.0 and m["loss"] > 0 and m["samples_per_s"] > 0
    assert model.training


def test_evaluate_matches_a_manual_computation(setup):
    model, _, _, x, y = setup
    model.eval()
    with torch.no_grad():
        out = model(x)
    expected_loss = nn.functional.cross_entropy(out, y).item()
    expected_acc = (out.argmax(1) == y).float().mean().item()
    model.train()
    r = evaluate(model, tensor_loader(x, y, batch_size=50), nn.CrossEntropyLoss(), "cpu")  # 50 does not divide 256
    assert r["samples"] == 256.0
    assert r["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert r["accuracy"] == pytest.approx(expected_acc)
    assert model.training, "evaluate() restores the training mode"
    preds, targets = predict(model, tensor_loader(x, y, batch_size=50), "cpu")
    assert torch.equal(targets, y) and preds.shape == y.shape
    assert (preds == y).float().mean().item() == pytest.approx(expected_acc)


def test_regression_has_no_accuracy():
    x = torch.randn(40, 3)
    y = x.sum(1, keepdim=True)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hist = fit(model, tensor_loader(x, y, batch_size=8), opt, nn.MSELoss(), "cpu", epochs=2,
               val_loader=tensor_loader(x, y, batch_size=8), progress=False)
    assert math.isnan(hist.train_acc[0]) and math.isnan(hist.val_acc[0])
    assert hist.train_loss[1] < hist.train_loss[0]


def test_progress_bar_respects_tqdm_disable(setup, capsys, monkeypatch):
    model, opt, loader, _, _ = setup
    monkeypatch.setenv("TQDM_DISABLE", "1")
    train_one_epoch(model, loader, opt, nn.CrossEntropyLoss(), "cpu")
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("TQDM_DISABLE")
    train_one_epoch(model, loader, opt, nn.CrossEntropyLoss(), "cpu", desc="demo")
    err = capsys.readouterr().err
    assert "demo" in err and "samples_per_s" in err
    train_one_epoch(model, loader, opt, nn.CrossEntropyLoss(), "cpu", progress=False)
    assert capsys.readouterr().err == ""


def test_errors(setup):
    model, opt, loader, x, y = setup
    loss_fn = nn.CrossEntropyLoss()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        train_one_epoch(lambda t: t, loader, opt, loss_fn, "cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer must be"):
        train_one_epoch(model, loader, "sgd", loss_fn, "cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="device must be"):
        evaluate(model, loader, loss_fn, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loader must be an iterable"):
        evaluate(model, 5, loss_fn, "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pair"):
        train_one_epoch(model, [x], opt, loss_fn, "cpu", progress=False)
    with pytest.raises(ValueError, match="no batches"):
        evaluate(model, [], loss_fn, "cpu")
    with pytest.raises(ValueError, match="max_batches"):
        train_one_epoch(model, loader, opt, loss_fn, "cpu", max_batches=0)
    with pytest.raises(ValueError, match="epochs must be"):
        fit(model, loader, opt, loss_fn, "cpu", epochs=0)
    with pytest.raises(TypeError, match="on_epoch_end must be callable"):
        fit(model, loader, opt, loss_fn, "cpu", epochs=1, on_epoch_end=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="diverged"):
        train_one_epoch(model, loader, opt, lambda out, t: out.sum() * float("nan"), "cpu", progress=False)
