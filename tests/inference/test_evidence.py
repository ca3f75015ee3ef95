"""Second derivatives of the closed-form evidences: each against the Hessian of the same
Gaussian written out with torch.distributions on the dense covariance (plain autograd)."""

from __future__ import annotations

import math

import pytest
import torch

from rfgp.inference._evidence import (
    fourier_kernel_negative_log_evidence,
    fourier_negative_log_evidence,
    kernel_negative_log_evidence,
    negative_log_evidence,
    stationary_negative_log_evidence,
)
from rfgp.kernels import FourierFeatureKernel
from tests.helpers import DT, gen

THETA = [math.log(0.8), math.log(1.2), math.log(0.9), math.log(1.5), math.log(0.05)]


def _rows(n=40, d=3):
    g = gen(11)
    x = torch.randn(n, d, generator=g, dtype=DT)
    y = torch.sin(2 * x).sum(-1)
    return x, (y - y.mean()).unsqueeze(-1)


def _dense_nll(cov, y):
    zero = torch.zeros(cov.shape[0], dtype=DT)
    return -torch.distributions.MultivariateNormal(zero, cov).log_prob(y.T).sum()


def _matern_profile(r2, nu):
    if nu is None:
        return torch.exp(-0.5 * r2)
    apart = r2 > 0
    r = torch.where(apart, torch.where(apart, r2, torch.ones_like(r2)).sqrt(), 0.0)
    c = math.sqrt(2 * nu)
    poly = {0.5: 1.0, 1.5: 1.0 + c * r, 2.5: 1.0 + c * r + c * c * r2 / 3.0}[nu]
    return poly * torch.exp(-c * r)


def _hessians(loss, reference):
    theta = torch.tensor(THETA, dtype=DT)
    got = torch.autograd.functional.hessian(loss, theta)
    want = torch.autograd.functional.hessian(reference, theta)
    return got, want


@pytest.mark.parametrize("spectral,nu", [("rbf", None), ("matern12", 0.5), ("matern32", 1.5),
                                         ("matern52", 2.5)])
def test_exact_evidence_has_the_dense_gaussians_second_derivatives(spectral, nu):
    x, y = _rows()
    kernel = FourierFeatureKernel(16, spectral, input_dim=3, seed=0).double()

    def loss(t):
        return fourier_kernel_negative_log_evidence(kernel, x, y, t[:3].exp(), t[3].exp(),
                                                    t[4].exp(), exact=True)

    def reference(t):
        z = x / t[:3].exp()
        r2 = (z.unsqueeze(1) - z.unsqueeze(0)).square().sum(-1)
        return _dense_nll(t[3].exp() * _matern_profile(r2, nu)
                          + t[4].exp() * torch.eye(len(x), dtype=DT), y)

    got, want = _hessians(loss, reference)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9 * float(want.abs().max()))


@pytest.mark.parametrize("rows", [40, 12])  # weight space (N >= D) and function space
def test_feature_evidence_has_the_dense_gaussians_second_derivatives(rows):
    x, y = _rows(rows)
    kernel = FourierFeatureKernel(32, input_dim=3, seed=0).double()
    x = kernel.prepare_input(x)

    def loss(t):
        return fourier_kernel_negative_log_evidence(kernel, x, y, t[:3].exp(), t[3].exp(),
                                                    t[4].exp(), exact=False)

    def reference(t):
        proj = kernel.projections(x / t[:3].exp())
        z = torch.cat([proj.cos(), proj.sin()], -1) * (t[3].exp() / proj.shape[1]).sqrt()
        return _dense_nll(z @ z.T + t[4].exp() * torch.eye(rows, dtype=DT), y)

    got, want = _hessians(loss, reference)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9 * float(want.abs().max()))


def test_each_closed_form_evidence_is_twice_differentiable_in_all_its_inputs():
    # Second derivatives through features, a dense kernel matrix, projections and the
    # noise directly: the gradient of (gradient . v) against the dense reference's.
    g = gen(12)
    z = torch.randn(30, 6, generator=g, dtype=DT)
    y = torch.randn(30, 2, generator=g, dtype=DT)
    noise = torch.tensor(0.3, dtype=DT)
    one = torch.tensor(1.7, dtype=DT)
    eye = torch.eye(30, dtype=DT)
    cases = [
        (lambda a, s: negative_log_evidence(a, y, s), lambda a, s: _dense_nll(a @ a.T + s * eye, y),
         z),
        (lambda a, s: negative_log_evidence(a, y, s),  # function space: N < D
         lambda a, s: _dense_nll(a @ a.T + s * eye, y), torch.randn(30, 40, generator=g,
                                                                     dtype=DT)),
        (lambda a, s: kernel_negative_log_evidence(a @ a.T, y, s),
         lambda a, s: _dense_nll(a @ a.T + s * eye, y), z),
        (lambda p, s: fourier_negative_log_evidence(p, y, one, s),
         lambda p, s: _dense_nll(_cos_sin(p, one) @ _cos_sin(p, one).T + s * eye, y),
         torch.randn(30, 5, generator=g, dtype=DT)),
        (lambda a, s: stationary_negative_log_evidence(a, y, torch.ones(6, dtype=DT), one, s, 1.5),
         lambda a, s: _dense_nll(one * _matern_profile(
             (a.unsqueeze(1) - a.unsqueeze(0)).square().sum(-1), 1.5) + s * eye, y), z),
    ]
    for loss, reference, first in cases:
        got = torch.autograd.functional.hessian(loss, (first, noise))
        want = torch.autograd.functional.hessian(reference, (first, noise))
        for got_row, want_row in zip(got, want):
            for a, b in zip(got_row, want_row):
                torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9 * float(b.abs().max()))


def _cos_sin(p, a):
    return torch.cat([p.cos(), p.sin()], -1) * (a / p.shape[1]).sqrt()


def test_first_derivatives_keep_the_closed_form_without_a_graph():
    # Without create_graph the closed forms answer, and agree with the twice-differentiable path.
    x, y = _rows()
    kernel = FourierFeatureKernel(16, input_dim=3, seed=0).double()
    theta = torch.tensor(THETA, dtype=DT, requires_grad=True)
    value = fourier_kernel_negative_log_evidence(kernel, x, y, theta[:3].exp(), theta[3].exp(),
                                                 theta[4].exp(), exact=True)
    (plain,) = torch.autograd.grad(value, theta)
    value = fourier_kernel_negative_log_evidence(kernel, x, y, theta[:3].exp(), theta[3].exp(),
                                                 theta[4].exp(), exact=True)
    (graphed,) = torch.autograd.grad(value, theta, create_graph=True)
    assert plain.grad_fn is None and graphed.grad_fn is not None
    torch.testing.assert_close(plain, graphed.detach(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rows", [60, 30], ids=["weight-space", "function-space"])
def test_the_closed_form_gradient_in_the_targets_is_the_solve(rows):
    # d(-log N(y; 0, C))/dy = C^{-1} y: the searched prior mean moves along it. Checked against
    # finite differences for the features' evidence (both forms) and the Fourier projections'.
    g = gen(31)
    z = torch.randn(rows, 40 if rows < 40 else 10, generator=g, dtype=DT)
    y = torch.randn(rows, 2, generator=g, dtype=DT, requires_grad=True)
    noise = torch.tensor(0.3, dtype=DT)
    assert torch.autograd.gradcheck(lambda t: negative_log_evidence(z, t, noise), (y,))
    (grad,) = torch.autograd.grad(negative_log_evidence(z, y, noise), y)
    cov = z @ z.T + noise * torch.eye(rows, dtype=DT)
    torch.testing.assert_close(grad, torch.linalg.solve(cov, y.detach()), rtol=1e-10, atol=0)
    proj = torch.randn(rows, 8, generator=g, dtype=DT)
    one = torch.tensor(1.3, dtype=DT)
    assert torch.autograd.gradcheck(
        lambda t: fourier_negative_log_evidence(proj, t, one, noise), (y,))
