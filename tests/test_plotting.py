import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from utils import plot_curves, plot_image_grid, plot_matrix  # noqa: E402


def teardown_function():
    plt.close("all")


def test_plot_curves_draws_each_curve():
    fig = plot_curves({"train": [3, 2, 1], "test": [3.5, 2.5, 2]}, ylabel="loss", logy=True)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["train", "test"]
    assert list(ax.lines[0].get_ydata()) == [3.0, 2.0, 1.0]
    assert ax.get_yscale() == "log"


def test_plot_curves_errors():
    with pytest.raises(TypeError, match="mapping"):
        plot_curves([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        plot_curves({})
    with pytest.raises(ValueError, match="'a' has no values"):
        plot_curves({"a": []})


def test_plot_image_grid_shapes():
    fig = plot_image_grid(torch.rand(5, 1, 8, 8), titles=list("abcde"), ncols=3)
    assert len(fig.axes) == 6  # 2 rows x 3 columns, the last one empty
    assert [ax.get_title() for ax in fig.axes[:5]] == list("abcde")


def test_plot_image_grid_shows_each_image():
    """Colour images are drawn channels-last and stretched to [0, 1]; grey ones as given, in the grey map."""
    colour = torch.rand(2, 3, 8, 8) * 4 - 1
    shown = plot_image_grid(colour).axes[1].images[0].get_array()
    stretched = (colour[1] - colour[1].min()) / (colour[1].max() - colour[1].min())
    np.testing.assert_allclose(shown, stretched.permute(1, 2, 0).numpy(), atol=1e-6)
    grey = torch.rand(2, 8, 8)
    [image] = plot_image_grid(grey).axes[1].images
    np.testing.assert_array_equal(image.get_array(), grey[1].numpy())
    assert image.get_cmap().name == "gray"


@pytest.mark.parametrize("shape", [(8, 8), (2, 2, 8, 8), (0, 1, 8, 8)])
def test_plot_image_grid_bad_shapes(shape):
    with pytest.raises(ValueError, match="must have shape"):
        plot_image_grid(torch.rand(shape))


def test_plot_image_grid_other_errors():
    with pytest.raises(TypeError, match="tensor"):
        plot_image_grid(np.zeros((1, 8, 8)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 titles for 3 images"):
        plot_image_grid(torch.rand(3, 8, 8), titles=["a", "b"])
    with pytest.raises(ValueError, match="ncols"):
        plot_image_grid(torch.rand(3, 8, 8), ncols=0)


def test_plot_matrix():
    matrix = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5], [7.0, 8.0, 9.0]])
    ax = plot_matrix(matrix, xlabels=list("abc"), ylabels=list("xyz"), annotate=True, title="M").axes[0]
    assert ax.get_title() == "M"
    np.testing.assert_array_equal(ax.images[0].get_array(), matrix.numpy())  # row r drawn at height r
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abc")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("xyz")
    assert {t.get_position(): t.get_text() for t in ax.texts}[(2, 1)] == "6.5"  # (column, row)
    with pytest.raises(ValueError, match="2-D"):
        plot_matrix(np.zeros(3))
    with pytest.raises(ValueError, match="2 xlabels for 3 columns"):
        plot_matrix(np.zeros((3, 3)), xlabels=["a", "b"])
    with pytest.raises(ValueError, match="1 ylabels for 3 rows"):
        plot_matrix(np.zeros((3, 3)), ylabels=["a"])
