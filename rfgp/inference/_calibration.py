r"""Calibration: the outputscale and the noise that maximise the evidence of the model that
predicts.

Whatever stage chose the lengthscales, the final model is the ``D``-feature one: its features
:math:`\Phi` (``N x D``, at the outputscale :math:`s_0` the kernel holds) span what it can fit,
and a variation they cannot follow must be called noise, or the model is overconfident. With
the Gram matrix :math:`G = \Phi^\top \Phi = Q \Lambda Q^\top` factorised once, the negative log
evidence of the model with outputscale :math:`a s_0` and noise :math:`\sigma^2`,

.. math::
    -2 \log p(y) = \sum_t \Big[\frac{y_t^\top y_t}{\sigma^2}
        - \sum_i \frac{\tilde b_{it}^2}{\sigma^2 (\lambda_i + \sigma^2 / a)}\Big]
        + T \sum_i \log\big(1 + a \lambda_i / \sigma^2\big) + N T \log \sigma^2
        + N T \log 2\pi,

with :math:`\tilde b = Q^\top \Phi^\top y`, costs :math:`O(D T)` per evaluation, so the two
scales are maximised exactly (Newton's method on :math:`(\log a, \log(\sigma^2 - \sigma^2_0))`).
On fewer rows than features the kernel matrix :math:`K = \Phi \Phi^\top = U \Lambda U^\top`
is factorised instead, and

.. math::
    -2 \log p(y) = \sum_{i, t} \frac{(u_i^\top y_t)^2}{a \lambda_i + \sigma^2}
        + T \sum_i \log(a \lambda_i + \sigma^2) + N T \log 2\pi,

the same function in :math:`O(N T)` per evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from gpytorch.kernels import AdditiveKernel, Kernel
from torch import Tensor

from rfgp._validation import check_int, check_positive, check_real, check_tensor
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._spectrum import spectrum_weights
from rfgp.inference._statistics import accumulate_gram, symmetrize_upper
from rfgp.kernels._composition import feature_kernel

__all__ = ["CHUNK_ROWS", "ScaleEvidence", "feature_model_evidence", "kernel_spectral_statistics",
           "maximize_scale_evidence", "spectral_statistics"]

#: Rows of features formed at once, for a Gram matrix or a product with the features: a few
#: hundred MB at D = 8192.
CHUNK_ROWS = 4096

# Newton's method on two smooth parameters: the iteration stops when a step changes the loss
# per datum by less than this, or after _MAX_NEWTON steps.
_NEWTON_TOLERANCE = 1e-12
_MAX_NEWTON = 100


@dataclass
class ScaleEvidence:
    """The spectral form of a fitted feature model's evidence (see the module docstring).

    Attributes:
        eigenvalues: eigenvalues :math:`\\lambda` of :math:`\\Phi^\\top \\Phi` (``(D,)``,
            weight space) or of :math:`\\Phi \\Phi^\\top` (``(N,)``), clamped at zero.
        projections: :math:`\\sum_t \\tilde b_{it}^2` (weight space) or
            :math:`\\sum_t (u_i^\\top y_t)^2`.
        target_squares: :math:`\\sum_t y_t^\\top y_t`.
        num_data: ``N``.
        num_columns: ``T``.
    """

    eigenvalues: Tensor
    projections: Tensor
    target_squares: float
    num_data: int
    num_columns: int
    weight_space: bool = True

    def negative_log_evidence(self, log_factor: Tensor, noise: Tensor) -> Tensor:
        """:math:`-\\log p(y)` at outputscale factor :math:`a = e^{\\text{log\\_factor}}` and
        noise :math:`\\sigma^2` (0-d tensors)."""
        factor = log_factor.exp()
        lam, proj = self.eigenvalues, self.projections
        constant = self.num_data * self.num_columns * math.log(2 * math.pi)
        if not self.weight_space:
            total = factor * lam + noise
            return 0.5 * ((proj / total).sum() + self.num_columns * total.log().sum() + constant)
        quad = (self.target_squares - (proj / (lam + noise / factor)).sum()) / noise
        logdet = self.num_columns * (torch.log1p(factor * lam / noise).sum()
                                     + self.num_data * noise.log())
        return 0.5 * (quad + logdet + constant)


def spectral_statistics(gram: Tensor, rhs: Tensor, target_squares: float,
                        num_data: int) -> ScaleEvidence:
    r"""Factorise a feature model's statistics for :func:`maximize_scale_evidence`.

    Args:
        gram: ``(D, D)`` symmetric :math:`\Phi^\top \Phi` (features at the kernel's outputscale).
        rhs: ``(D,)`` or ``(D, T)`` :math:`\Phi^\top y`.
        target_squares: :math:`\sum_t y_t^\top y_t`.
        num_data: ``N``, the rows behind the statistics.

    Returns:
        The :class:`ScaleEvidence`, in float64 (the spectrum and the projections' weights on
        it, :math:`O(D^3)`: :func:`~rfgp.inference._spectrum.spectrum_weights`).

    Example:
        >>> phi = torch.randn(50, 8, dtype=torch.float64)
        >>> y = torch.randn(50, dtype=torch.float64)
        >>> ev = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 50)
        >>> tuple(ev.eigenvalues.shape), ev.num_columns
        ((8,), 1)
    """
    gram = check_tensor("gram", gram, min_dim=2, max_dim=2, non_empty=True)
    rhs = check_tensor("rhs", rhs, min_dim=1, max_dim=2, non_empty=True)
    if gram.shape[0] != gram.shape[1] or rhs.shape[0] != gram.shape[0]:
        raise ValueError(
            f"gram must be square (D, D) and rhs (D,) or (D, T), got {tuple(gram.shape)} and "
            f"{tuple(rhs.shape)}"
        )
    num_data = check_int("num_data", num_data, minimum=1)
    target_squares = check_positive("target_squares", target_squares)
    rhs = rhs.reshape(rhs.shape[0], -1).to(torch.float64)
    eigenvalues, projections = spectrum_weights(gram, rhs)
    return ScaleEvidence(eigenvalues.clamp_min(0.0), projections, float(target_squares),
                         num_data, rhs.shape[1])


def kernel_spectral_statistics(kernel_matrix: Tensor, y: Tensor) -> ScaleEvidence:
    r"""Factorise the kernel matrix :math:`K = \Phi \Phi^\top` of ``N`` rows (fewer than the
    features) for :func:`maximize_scale_evidence`.

    Args:
        kernel_matrix: ``(N, N)`` symmetric :math:`\Phi \Phi^\top`.
        y: ``(N,)`` or ``(N, T)`` targets.

    Example:
        >>> phi = torch.randn(8, 50, dtype=torch.float64)
        >>> y = torch.randn(8, dtype=torch.float64)
        >>> weight = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 8)
        >>> function = kernel_spectral_statistics(phi @ phi.T, y)
        >>> a, s = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
        >>> bool(torch.isclose(weight.negative_log_evidence(a, s),
        ...                    function.negative_log_evidence(a, s)))
        True
    """
    kernel_matrix = check_tensor("kernel_matrix", kernel_matrix, min_dim=2, max_dim=2,
                                 non_empty=True)
    y = check_tensor("y", y, min_dim=1, max_dim=2, non_empty=True)
    if kernel_matrix.shape[0] != kernel_matrix.shape[1] or y.shape[0] != kernel_matrix.shape[0]:
        raise ValueError(
            f"kernel_matrix must be square (N, N) and y (N,) or (N, T), got "
            f"{tuple(kernel_matrix.shape)} and {tuple(y.shape)}"
        )
    y = y.reshape(y.shape[0], -1).to(torch.float64)
    eigenvalues, projections = spectrum_weights(kernel_matrix, y)
    return ScaleEvidence(eigenvalues.clamp_min(0.0), projections, float(y.square().sum()),
                         y.shape[0], y.shape[1], weight_space=False)


def feature_model_evidence(kernel: Kernel, x: Tensor, y: Tensor,
                           products: Optional[list] = None) -> ScaleEvidence:
    """The spectral statistics of ``kernel``'s feature model on ``(x, y)``: its Gram matrix
    accumulated over row chunks in float64 and factorised (the kernel matrix on fewer rows
    than features). A ``products`` list receives ``(Z^T Z, Z^T Y, outputscale)`` (weight
    space only; the outputscale ``Z`` was formed at), so that a fit of the same features at
    another outputscale need not form them again
    (:func:`~rfgp.inference.fit_calibrated`).

    Example:
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> k = ScaleKernel(FourierFeatureKernel(64, input_dim=2, ard_num_dims=2)).double()
        >>> x = torch.randn(100, 2, dtype=torch.float64)
        >>> ev = feature_model_evidence(k, x, torch.randn(100, dtype=torch.float64))
        >>> tuple(ev.eigenvalues.shape), ev.weight_space
        ((64,), True)
    """
    feature_map = FeatureMap(feature_kernel(kernel))
    width = feature_map.num_real_features
    n = x.shape[0]
    columns = y.reshape(n, -1).to(torch.float64)
    with torch.no_grad():
        if n < width:
            phi = feature_map.real_rows(x).to(torch.float64)
            return kernel_spectral_statistics(phi @ phi.transpose(0, 1), columns)
        gram = torch.zeros(width, width, dtype=torch.float64, device=x.device)
        rhs = torch.zeros(width, columns.shape[1], dtype=torch.float64, device=x.device)
        for start in range(0, n, CHUNK_ROWS):
            z = feature_map.real_rows(x[start:start + CHUNK_ROWS]).to(torch.float64)
            accumulate_gram(gram, z)
            rhs += z.transpose(0, 1) @ columns[start:start + CHUNK_ROWS]
        gram = symmetrize_upper(gram)
    if products is not None:
        products.append((gram, rhs, kernel_outputscale(kernel)))
    return spectral_statistics(gram, rhs, float(columns.square().sum()), n)


def kernel_outputscale(kernel: Kernel) -> float:
    """The outputscale of ``kernel``'s first ``ScaleKernel`` part (a calibration scales every
    part by one factor)."""
    part = kernel.kernels[0] if isinstance(kernel, AdditiveKernel) else kernel
    return float(part.outputscale.detach())


def maximize_scale_evidence(evidence: ScaleEvidence, noise: float,
                            noise_floor: float = 0.0,
                            factor_start: float = 1.0,
                            condition: float = 0.0) -> tuple[float, float, float]:
    r"""The outputscale factor :math:`a` and noise :math:`\sigma^2 > \sigma^2_0` that maximise
    the evidence of a feature model, by Newton's method from ``(factor_start, noise)`` and from
    a start in the data's own units (half the targets' mean square as noise, half as signal),
    the better end kept; the search runs in those units, so that targets scaled by
    :math:`s` give :math:`s^2` times both scales at any :math:`s` float64 holds. With
    :math:`\Phi^\top\Phi = Q \Lambda Q^\top` and :math:`\tilde b = Q^\top \Phi^\top y`,

    .. math::
        -2 \log p(y) = \frac{y^\top y - \sum_i \tilde b_i^2 / (\lambda_i + \sigma^2/a)}
            {\sigma^2} + \sum_i \log\big(1 + a \lambda_i / \sigma^2\big)
            + N \log(2 \pi \sigma^2),

    :math:`O(D)` per evaluation once the Gram matrix is factorised.

    Args:
        evidence: from :func:`spectral_statistics`.
        noise: the starting noise :math:`\sigma^2` (positive).
        noise_floor: :math:`\sigma^2_0 \ge 0`, the noise's lower bound.
        factor_start: the starting factor (positive).
        condition: :math:`c \ge 0`: the noise is at least :math:`\sigma^2_0 + c\, a
            \lambda_{\max}`, so that the solve's matrix :math:`a G / \sigma^2 + I` keeps a
            condition number below :math:`1 + 1/c` (a target the features fit exactly would
            otherwise drive the noise to its floor and the factor without bound).

    Returns:
        ``(factor, noise, negative_log_evidence)`` at the maximum.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> phi = torch.randn(4000, 20, dtype=torch.float64, generator=g)
        >>> w = torch.randn(20, dtype=torch.float64, generator=g) * 3.0  # a = 9
        >>> y = phi @ w + 0.5 * torch.randn(4000, dtype=torch.float64, generator=g)
        >>> ev = spectral_statistics(phi.T @ phi, phi.T @ y, float(y @ y), 4000)
        >>> factor, noise, _ = maximize_scale_evidence(ev, 1.0)
        >>> abs(noise - 0.25) < 0.02, 4 < factor < 20
        (True, True)
    """
    if not isinstance(evidence, ScaleEvidence):
        raise TypeError(
            "evidence must be a ScaleEvidence (from spectral_statistics or "
            f"kernel_spectral_statistics), got {type(evidence).__name__}"
        )
    noise = check_positive("noise", noise)
    factor_start = check_positive("factor_start", factor_start)
    noise_floor = check_real("noise_floor", noise_floor, low=0.0)
    # A negative c would lower the noise below its floor (to negative values), and NaN or inf
    # make every noise non-finite: only finite c >= 0 bound the condition number.
    condition = check_real("condition", condition, low=0.0)
    # The search runs in the data's own units: the targets divided by their mean square m
    # and the features by their mean eigenvalue v. The evidence's maximum is equivariant
    # (a / m * v and sigma^2 / m there, -log p less N T log(m) / 2), while its Hessian's
    # autograd passes through powers of sigma^2 that over- or underflow at targets scaled
    # by 1e-100 (a NaN Hessian: Newton would not move).
    scale = 1.0 / (evidence.num_data * evidence.num_columns)
    mean_square = evidence.target_squares * scale
    unit = mean_square if mean_square > 0 and math.isfinite(mean_square) else 1.0
    trace = float(evidence.eigenvalues.sum())
    width = evidence.eigenvalues.numel()
    level = trace / width if trace > 0 and math.isfinite(trace) else 1.0
    evidence = ScaleEvidence(
        evidence.eigenvalues / level,
        evidence.projections / (unit * level if evidence.weight_space else unit),
        evidence.target_squares / unit, evidence.num_data, evidence.num_columns,
        evidence.weight_space)
    noise, noise_floor, factor_start = noise / unit, noise_floor / unit, factor_start / unit * level
    # Parameters: log a and log(sigma^2 - floor), started inside the domain.
    start_noise = max(noise - noise_floor, noise * 1e-3, 1e-300)
    params = torch.tensor([math.log(factor_start), math.log(start_noise)],
                          dtype=torch.float64)

    top = float(evidence.eigenvalues.max()) * condition

    def noise_of(p: Tensor) -> Tensor:
        return p[1].exp() + noise_floor + top * p[0].exp()

    def loss(p: Tensor) -> Tensor:
        return evidence.negative_log_evidence(p[0], noise_of(p)) * scale

    def newton(params: Tensor) -> tuple:
        value = loss(params)
        for _ in range(_MAX_NEWTON):
            grad = torch.autograd.functional.jacobian(loss, params)
            hess = torch.autograd.functional.hessian(loss, params)
            # Newton on |H|: the Newton step where the Hessian is positive definite; along a
            # direction of negative or vanishing curvature, the gradient over the curvature's
            # magnitude (a long step where the loss is flat, as it is along the factor when
            # the evidence wants a larger outputscale: a plain gradient step there crawls).
            # Always a descent direction; clamped, then halved until the loss falls.
            curvature, vectors = torch.linalg.eigh(hess)
            magnitude = curvature.abs().clamp_min(
                1e-12 * max(float(curvature.abs().max()), 1.0))
            step = -(vectors @ ((vectors.transpose(0, 1) @ grad) / magnitude))
            step = step.clamp(-5.0, 5.0)
            for _ in range(60):
                trial = params + step
                trial_value = loss(trial)
                if torch.isfinite(trial_value) and trial_value <= value:
                    break
                step = step / 2
            else:
                break
            improvement = float(value - trial_value)
            params, value = trial, trial_value
            if improvement < _NEWTON_TOLERANCE:
                break
        return params, value

    params, value = newton(params)
    # A start in other units than the data's (a noise of 1e-30 for targets of order one, or
    # targets scaled by 1e150 against a kernel at outputscale 1) can leave Newton's clamped
    # steps short of the maximum, or in the flat region of the condition bound. A second
    # start, half the targets' mean square as noise and half as signal (a tr G = N m / 2:
    # in these units noise 1/2 and factor N / (2 D)), does not depend on them; the better
    # end is kept.
    data_noise = max(0.5 - noise_floor, 0.5e-3)
    data_start = torch.tensor(
        [math.log(0.5 * evidence.num_data / width), math.log(data_noise)], dtype=torch.float64)
    other, other_value = newton(data_start)
    if bool(torch.isfinite(other_value)) and not other_value >= value:
        params, value = other, other_value
    factor = float(params[0].exp()) * unit / level
    noise_out = float(noise_of(params).detach()) * unit
    return factor, noise_out, float(value) / scale + 0.5 * math.log(unit) / scale
