"""Test-only feature maps and dense oracles for the solver tests."""

from __future__ import annotations

import math

import torch

from rfgp.kernels import FourierFeatureKernel, RandomFeatureKernel
from rfgp.ops import gaussian


class ComplexFourierKernel(RandomFeatureKernel):
    r"""Complex random Fourier features ``D^{-1/2} exp(i w^T x / l)`` (test only).

    ``E[Phi(x)^T conj Phi(y)] = exp(-||x - y||^2 / (2 l^2))``; ``Im K_hat != 0``.
    """

    has_lengthscale = True

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features=num_features, **kwargs)
        self.is_complex = True

    def _sample_weights(self, input_dim, generator):
        return {"frequencies": gaussian((self.num_features, input_dim), generator)}

    def _features(self, x):
        proj = (x / self.lengthscale.to(x.dtype)) @ self.frequencies.to(x.dtype).T
        return torch.polar(torch.ones_like(proj), proj) / math.sqrt(self.num_features)


class AsComplexKernel(RandomFeatureKernel):
    """Real features of an inner kernel returned as complex with zero imaginary part."""

    def __init__(self, inner):
        super().__init__(num_features=inner.num_features)
        self.inner = inner
        self.is_complex = True

    def _sample_weights(self, input_dim, generator):
        return {}

    def _ensure_weights(self, x):
        self.input_dim = x.shape[-1]

    def _features(self, x):
        phi = self.inner.features(x)
        return torch.complex(phi, torch.zeros_like(phi))


class TwoOutputKernel(RandomFeatureKernel):
    """p = 2 outputs per input: ``Phi(x) = [phi(x) a_1; phi(x) a_2]`` rows (test only)."""

    _outputs_per_input = 2

    def __init__(self, num_features, **kwargs):
        super().__init__(num_features=num_features, **kwargs)
        self.inner = FourierFeatureKernel(num_features, seed=kwargs.get("seed"))

    def _sample_weights(self, input_dim, generator):
        return {"mix": gaussian((2,), generator)}

    def _features(self, x):
        phi = self.inner.features(x)  # (N, D)
        mix = torch.stack([torch.ones_like(self.mix[0]), self.mix[0]]).to(x.dtype)
        # output 0: phi, output 1: phi * mix + a sign flip of half the columns (not a multiple)
        flip = torch.ones(phi.shape[-1], dtype=x.dtype)
        flip[: phi.shape[-1] // 2] = -1
        return torch.stack([phi * mix[0], phi * flip * mix[1]], dim=-2)


def dense_posterior(phi_train, y, noise, phi_test):
    """Textbook N x N posterior with kernel Phi Phi^H (literal Eqs. 84-85 with the correct row).

    phi_*: (R, D) complex or real rows; y (R,); noise (R,). Returns Re mean, Re cov.
    """
    k = phi_train @ phi_train.conj().T + torch.diag(noise.to(phi_train.dtype))
    kx = phi_test @ phi_train.conj().T  # k_hat(x_*, x_i)
    kinv_y = torch.linalg.solve(k, y.to(k.dtype))
    mean = (kx @ kinv_y).real
    cov = phi_test @ phi_test.conj().T - kx @ torch.linalg.solve(k, kx.conj().T)
    return mean, cov.real


def block_oracle(phi_train, y, noise, phi_test):
    """The complex posterior through the real 2D x 2D block system (no complex algebra)."""
    r, j = phi_train.real, phi_train.imag
    rw, jw = r / noise.unsqueeze(-1), j / noise.unsqueeze(-1)
    re_b = r.T @ rw + j.T @ jw + torch.eye(r.shape[1], dtype=r.dtype)
    im_b = r.T @ jw - j.T @ rw
    big = torch.cat([torch.cat([re_b, -im_b], 1), torch.cat([im_b, re_b], 1)], 0)
    b_re, b_im = rw.T @ y, -(jw.T @ y)  # Phi^H S^-1 y
    w = torch.linalg.solve(big, torch.cat([b_re, b_im]))
    d = r.shape[1]
    ts_r, ts_i = phi_test.real, phi_test.imag
    mean = ts_r @ w[:d] - ts_i @ w[d:]
    # Cov = Re(Phi_* B^{-1} Phi_*^H); B^{-1} v via the block system, v = conj(Phi_*)^T columns.
    rhs = torch.cat([ts_r.T, -ts_i.T])
    sol = torch.linalg.solve(big, rhs)
    cov = ts_r @ sol[:d] - ts_i @ sol[d:]
    return mean, cov
