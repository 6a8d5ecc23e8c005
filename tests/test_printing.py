import numpy as np
import pytest
import torch

from utils import fmt, show


def test_fmt_rounds_and_removes_negative_zero():
    assert fmt(torch.tensor([1 / 3, -1e-9, 2.0])) == "[0.3333, 0.0000, 2.0000]"
    assert fmt(-0.00001, 2) == "0.00"


def test_fmt_integers_and_bools_exact():
    assert fmt(torch.tensor([[1, 2], [3, 4]])) == "[[1, 2],\n [3, 4]]"
    assert fmt(torch.tensor([True, False])) == "[ True, False]"


def test_fmt_low_precision_dtypes():
    assert fmt(torch.tensor([1.5, 2.25], dtype=torch.bfloat16), 2) == "[1.50, 2.25]"
    assert fmt(torch.tensor(0.1, dtype=torch.float16), 3) == "0.100"


def test_fmt_numpy_and_lists():
    assert fmt(np.array([0.5, 1.25]), 1) == "[0.5, 1.2]"  # half to even
    assert fmt([1.0, 2.0], 0) == "[1, 2]"


def test_fmt_errors():
    with pytest.raises(TypeError, match="decimals must be an int"):
        fmt(1.0, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decimals must be >= 0"):
        fmt(1.0, -1)
    with pytest.raises(TypeError, match="expects a tensor"):
        fmt({"a": 1})
    with pytest.raises(TypeError, match="expects numbers"):
        fmt(["a", "b"])
    with pytest.raises(TypeError, match="complex"):
        fmt(torch.tensor([1 + 2j]))


def test_show_header(capsys):
    show(torch.tensor([1.0, 2.0], requires_grad=True), "w", decimals=1)
    out = capsys.readouterr().out.splitlines()
    assert out == ["w: shape=(2,) dtype=float32 device=cpu requires_grad=True", "[1.0, 2.0]"]
    show(3.14159, decimals=2)
    assert capsys.readouterr().out.splitlines() == ["float", "3.14"]
    with pytest.raises(TypeError, match="name must be a string"):
        show(1.0, name=3)  # type: ignore[arg-type]


def test_show_warning_prints_the_taught_warning_and_fails_without_it(capsys):
    import warnings

    from utils import show_warning

    def old_api():
        warnings.warn("`old` is deprecated. Use `new` instead.", FutureWarning, stacklevel=2)
        return 7

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under make test: the warning would otherwise be an error
        assert show_warning(old_api, FutureWarning, "deprecated") == 7
    assert capsys.readouterr().out == "FutureWarning: `old` is deprecated.\n"
    with pytest.raises(AssertionError, match="expected a UserWarning"):
        show_warning(old_api, UserWarning, "deprecated")
    with pytest.raises(AssertionError, match="containing 'gone'"):
        show_warning(lambda: 1, FutureWarning, "gone")
