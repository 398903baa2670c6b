"""The figures: image grids by torchvision's make_grid, ROC/PR curves of `jemeval ood --plot`,
distinguishable lines in `jemeval robust --plot`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jemeval.plots.grids import grid_image, mosaic


def _old_mosaic(x: torch.Tensor, ncol: int, pad: int = 1) -> np.ndarray:
    """jemeval 0.1's hand-written mosaic, kept here as the reference the make_grid version must match."""
    imgs = ((x.detach().float().cpu() + 1.0) / 2.0).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    n, h, w, c = imgs.shape
    nrows = -(-n // ncol)
    full = np.ones((nrows * ncol, h + pad, w + pad, c), dtype=np.float32)
    full[:n, :h, :w] = imgs
    grid = (full.reshape(nrows, ncol, h + pad, w + pad, c).transpose(0, 2, 1, 3, 4)
            .reshape(nrows * (h + pad), ncol * (w + pad), c))
    canvas = np.ones((grid.shape[0] + pad, grid.shape[1] + pad, c), dtype=np.float32)
    canvas[pad:, pad:] = grid
    return canvas


@pytest.mark.parametrize("n, c, h, w, ncol, pad", [
    (100, 1, 8, 8, 10, 1),   # the trainer's 10 x 10 digits grid
    (64, 3, 32, 32, 10, 1),  # a short last row (colour)
    (7, 3, 5, 4, 3, 2),      # non-square images, wider padding
    (3, 1, 8, 8, 10, 1),     # fewer images than columns
    (1, 1, 8, 8, 1, 1),      # one image
    (1, 3, 6, 6, 4, 1),
])
def test_make_grid_mosaic_is_pixel_identical_to_the_old_one(n, c, h, w, ncol, pad):
    g = torch.Generator().manual_seed(n * 7 + c)
    x = torch.rand(n, c, h, w, generator=g) * 2.4 - 1.2  # values outside [-1, 1] are clipped by both
    if n > 2:
        x[1] = float("nan")  # grid_rows' blank cells
    new, old = mosaic(x, ncol, pad), _old_mosaic(x, ncol, pad)
    assert new.shape == old.shape and new.dtype == old.dtype
    np.testing.assert_array_equal(new, old)  # NaN where the old one had NaN, every other pixel equal


def test_grid_image_is_rgb_chw_for_loggers():
    x = torch.zeros(4, 1, 8, 8)  # mid-gray in [-1, 1]
    img = grid_image(x, 2)
    assert img.shape == (3, 2 * 9 + 1, 2 * 9 + 1)
    assert img[:, 1:9, 1:9].eq(0.5).all() and img[:, 0, :].eq(1.0).all()  # gray images, white border


# -- OOD: histograms, ROC and PR curves ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ood_result(digits_classifier_ckpt):
    import jemeval
    from jemeval.evaluation.ood.evaluate import evaluate_ood

    model = jemeval.load_model(digits_classifier_ckpt)
    return evaluate_ood(model, ["uniform", "constant", "interp"], scores=["logpx", "maxprob"], n=150, seed=0,
                        progress=False)


def _curves(ax):
    return {line.get_label().split(",")[0]: (line.get_xdata(), line.get_ydata()) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_ood_curves_have_the_reported_areas(ood_result):
    from sklearn.metrics import auc

    from jemeval.plots import pyplot
    from jemeval.plots.ood import draw_ood_figure

    fig = draw_ood_figure(ood_result.extra["scores"], records=ood_result.records)
    try:
        rows = np.array(fig.axes).reshape(2, 3)
        checked = 0
        for score, (_, ax_roc, ax_pr) in zip(["logpx", "maxprob"], rows):
            roc, pr = _curves(ax_roc), _curves(ax_pr)
            assert set(roc) == set(pr) == {"uniform", "constant", "interp:digits"}
            for r in (r for r in ood_result.records if r["score"] == score):
                fpr, tpr = roc[r["ood"]]
                assert auc(fpr, tpr) == pytest.approx(r["auroc"], abs=1e-12)
                recall, precision = pr[r["ood"]]  # straight lines between the points: the trapezoidal AUPR
                assert auc(recall, precision) == pytest.approx(r["aupr_in"], abs=1e-12)
                checked += 1
        assert checked == 6
    finally:
        pyplot().close(fig)


def test_ood_plot_writes_one_png_with_histograms_and_curves(ood_result, tmp_path):
    from PIL import Image

    from jemeval.plots.ood import plot_ood_result, plot_score_histograms

    path = plot_ood_result(ood_result, tmp_path / "ood.png")
    hist_only = plot_score_histograms(ood_result.extra["scores"], tmp_path / "hist.png", records=ood_result.records)
    wide, narrow = Image.open(path).size, Image.open(hist_only).size
    assert wide[0] > 1.4 * narrow[0]  # three panels per score instead of one


# -- robust: lines that coincide stay visible --------------------------------------------------------------
def _robust_records(attack, k, mode, accuracies, eps=(0.0, 0.5, 1.0, 2.0)):
    return [{"attack": attack, "refine_steps": k, "grad_mode": mode, "epsilon": e, "robust_accuracy": a,
             "norm": "l2", "n": 100} for e, a in zip(eps, accuracies)]


def test_coinciding_robust_lines_are_banded_and_labelled_without_moving_values(tmp_path):
    from matplotlib.collections import LineCollection

    from jemeval.plots import LAYER_WIDTH, pyplot
    from jemeval.plots.robustness import draw_robustness, plot_robustness

    records = (_robust_records("pgd", 0, "full", [0.9, 0.3, 0.0, 0.0])
               + _robust_records("pgd", 0, "bpda", [0.9, 0.3, 0.0, 0.0])
               + _robust_records("pgd", 2, "full", [0.8, 0.5, 0.2, 0.0]))
    fig = draw_robustness(records)
    try:
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
        assert set(lines) == {"K=0 pgd (full)", "K=0 pgd (bpda) = K=0 pgd (full)", "K=2 pgd (full)"}
        for label, line in lines.items():  # every value is drawn where it is
            assert list(line.get_ydata()) == [r["robust_accuracy"] for r in records
                                              if label.startswith(f"K={r['refine_steps']} pgd ({r['grad_mode']})")]
        bands = [c for c in ax.collections if isinstance(c, LineCollection)]
        widths = sorted(w for c in bands for w in c.get_linewidths())
        # K=0 full's 3 segments are K=0 bpda's (one later line each); K=2 shares only the point (2, 0)
        assert widths == [1.5 + LAYER_WIDTH] * 3
        rings = [line for line in ax.get_lines() if line.get_label().startswith("_") and line.get_markerfacecolor()
                 == "none"]
        assert len(rings) == 4 + 1  # K=0 full's 4 points under K=0 bpda; K=0 bpda's (2, 0) under K=2
    finally:
        pyplot().close(fig)
    assert plot_robustness(records, tmp_path / "r.png").stat().st_size > 0
