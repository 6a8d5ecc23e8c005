import pytest
import torch

from utils import DEVICE_ENV_VAR, get_device


def test_env_forces_cpu(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, "cpu")
    assert get_device() == torch.device("cpu")


def test_default_order_falls_back_to_cpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("utils.device._mps_available", lambda: False)
    assert get_device() == torch.device("cpu")


def test_default_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("utils.device._mps_available", lambda: True)
    assert get_device() == torch.device("mps")


def test_empty_env_means_auto(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, "  ")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("utils.device._mps_available", lambda: False)
    assert get_device() == torch.device("cpu")


def test_argument_beats_env(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, "bogus")
    assert get_device("CPU") == torch.device("cpu")


@pytest.mark.parametrize("bad", ["gpu0", "tpu", "banana"])
def test_unknown_device_is_named(monkeypatch, bad):
    monkeypatch.setenv(DEVICE_ENV_VAR, bad)
    with pytest.raises(ValueError, match=DEVICE_ENV_VAR):
        get_device()


def test_unavailable_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        get_device("cuda")


def test_cuda_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="only 1 CUDA device"):
        get_device("cuda:3")


def test_unavailable_mps(monkeypatch):
    monkeypatch.setattr("utils.device._mps_available", lambda: False)
    with pytest.raises(ValueError, match="MPS is not available"):
        get_device("mps")


def test_type_error():
    with pytest.raises(TypeError, match="expects a string"):
        get_device(0)  # type: ignore[arg-type]
