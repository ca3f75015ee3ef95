"""fit_auto's constant prior mean: chosen by the first search with the hyperparameters,
kept by every later stage, and carried by the returned model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rfgp import RandomFeatureGP, fit_auto
from rfgp.recipes import FitReport

DT = torch.float64
OPTIONS = dict(num_features=128, search_features=64, seed=0, time_budget=20,
               lengthscale_draws=0)


def _data(n=600, offset=4.0, columns=1):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, 2, generator=g, dtype=DT)
    f = torch.sin(5 * x[:, 0]) * (1 + x[:, 1])
    ys = [(t + 1) * f + offset * (1 - 2 * t) + 0.05 * torch.randn(n, generator=g, dtype=DT)
          for t in range(columns)]
    return x, ys[0] if columns == 1 else torch.stack(ys, -1)


def test_the_returned_model_is_the_direct_fit_with_the_chosen_mean():
    # The recipe fits the final model on the targets less the mean and gives it that mean:
    # the model of its kernel, noise and mean fitted to the targets as given.
    x, y = _data()
    report = FitReport()
    gp = fit_auto(x, y, report=report, **OPTIONS)
    assert report.prior_mean is not None
    torch.testing.assert_close(gp.prior_mean, report.prior_mean, rtol=0, atol=0)
    # the data's offset, 4, less the sine's mean over the inputs: the mean sits near the
    # targets' level (within the prior's pull toward zero and the kernel's own constant part)
    assert 2.0 < float(gp.prior_mean) < 5.0
    direct = RandomFeatureGP(gp.kernel, noise=gp.noise.detach(), prior_mean=gp.prior_mean)
    direct.fit(x, y)
    xq = torch.rand(20, 2, dtype=DT) * 2
    torch.testing.assert_close(gp.predict(xq), direct.predict(xq), rtol=0, atol=1e-9)
    zero = FitReport()
    centred = fit_auto(x, y - y.mean(), report=zero, prior_mean="zero", **OPTIONS)
    assert zero.prior_mean is None and float(centred.prior_mean) == 0.0


def test_one_mean_per_target_column():
    x, y = _data(columns=2)
    report = FitReport()
    gp = fit_auto(x, y, report=report, **OPTIONS)
    assert report.prior_mean.shape == (2,)
    # offsets +4 and -4: the columns' means have opposite signs
    assert float(report.prior_mean[0]) > 2.0 and float(report.prior_mean[1]) < -2.0
    assert gp.predict(x[:3]).shape == (3, 2)


def test_rows_behind_a_memory_map_give_the_in_memory_mean(tmp_path):
    # The streamed moments centre the source's rows as the in-memory fit centres its tensor.
    x, y = _data(1600)
    opts = dict(OPTIONS, subsample=250, refine_rows=500, num_features=256)
    in_memory = fit_auto(x, y, **opts)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    mapped = fit_auto(np.load(tmp_path / "x.npy", mmap_mode="r"),
                      np.load(tmp_path / "y.npy", mmap_mode="r"), **opts)
    torch.testing.assert_close(mapped.prior_mean, in_memory.prior_mean, rtol=1e-12, atol=0)
    xt = torch.rand(30, 2, dtype=DT)
    mean = in_memory.predict(xt)
    torch.testing.assert_close(mapped.predict(xt), mean, rtol=1e-9,
                               atol=1e-9 * float(mean.abs().max()))


def test_a_bad_prior_mean_option_is_refused_naming_it():
    x, y = _data(100)
    with pytest.raises(ValueError, match="prior_mean"):
        fit_auto(x, y, prior_mean="median")


def test_centred_data_keep_every_rows_moments():
    # The stages after the search read y - m everywhere: the moments of every row follow by
    # mean((y - m)^2) = mean(y^2) - 2 m mean(y) + m^2, per column, averaged over the columns.
    from rfgp._data import ArraySource
    from rfgp.recipes._stage import RecipeData

    x, y = _data(400, columns=2)
    unit = 2.0
    ys = y / unit
    data = RecipeData(None, None, x, ys, x, y, torch.ones(2, dtype=DT), unit,
                      torch.Generator(), target_mean_square=float(ys.square().mean()),
                      target_mean=ys.mean(0), source=ArraySource(x, y))
    m = torch.tensor([1.5, -2.0], dtype=DT)
    centred = data.centred(m)
    assert centred.mean_square() == pytest.approx(float((ys - m).square().mean()), rel=1e-12)
    torch.testing.assert_close(centred.target_mean, (ys - m).mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(centred.y_data, y - m * unit, rtol=0, atol=0)
    torch.testing.assert_close(centred.source.take(torch.arange(5))[1], y[:5] - m * unit,
                               rtol=0, atol=1e-15)
    assert data.centred(torch.zeros(2, dtype=DT)) is data
