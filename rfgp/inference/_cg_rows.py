r"""The rows' form of the iterative solve's dense variances.

With more features than rows (``N < W``) the dense route of :mod:`~rfgp.inference._cg_dense`
need not form the ``W x W`` matrix :math:`B`: :class:`RowDenseInverse` answers by Woodbury's
identity through the ``N x N`` matrix :math:`K = I + \Psi\Psi^H` of the rows, formed from the
features the fit keeps. :func:`row_precision_holds` is the precision its difference needs;
:func:`row_form_open` says, before a fit, whether the form will be open (the recipe's
forecast of the variances' cost). :class:`RowsFit` hands a calibration's :math:`\Phi\Phi^\top`
to the fit, which :func:`fit_by_rows` turns into the mean weights and the variances' factor
with one Cholesky factorisation, without conjugate gradients.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._cg_cost import feature_cache_bytes, rows_route
from rfgp.inference._cg_variance import _real_gram, _squared_norms
from rfgp.inference._linalg import try_cholesky

__all__ = ["RowDenseInverse", "RowsFit", "fit_by_rows", "row_form_open", "row_precision_holds"]


class RowDenseInverse:
    r""":math:`B^{-1}` through the rows: with :math:`\Psi = S^{-1/2}\Phi` (``N x W``) and
    :math:`B = I + \Psi^H\Psi`, Woodbury's identity gives

    .. math::
        B^{-1} = I - \Psi^H K^{-1} \Psi,\qquad K = I + \Psi\Psi^H = LL^H,

    so :math:`\phi_* B^{-1}\phi_*^H = \|\phi_*\|^2 - \|L^{-1}\Psi\phi_*^H\|^2`, the
    covariances :math:`\mathrm{Re}\{\Phi_*\Phi_*^H - C^H C\}`, :math:`C = L^{-1}\Psi
    \Phi_*^H`, differentiable in the query rows. Where ``N < W`` forming ``K`` (``N^2 W / 2``
    multiply-adds, ``N^3 / 3`` for its factor, ``N^2`` numbers twice) costs less than
    :class:`~rfgp.inference._cg_dense.DenseInverse`'s ``B`` (``5 N W^2 / 8``, ``W^3 / 3``,
    ``W^2`` numbers twice): under a third of it at ``W = 2N``. Each query row then costs
    ``N W + N^2`` (a product with the kept features and a triangular solve) against ``W^2``.

    The difference loses digits where a variance is small beside its prior
    :math:`\|\phi_*\|^2`: its relative error is about :math:`\kappa(K)\,\epsilon\,
    \|\phi_*\|^2 / v \le (1 + \lambda_{\max})^2\,\epsilon` (:math:`v \ge \|\phi_*\|^2
    / (1 + \lambda_{\max})`), which the routes hold to a tenth of the variance tolerance
    before they take this form (:func:`row_precision_holds`); a difference rounded below
    zero is returned as zero.

    Args:
        operator: the fit's :class:`~rfgp.inference._feature_operator.FeatureOperator`,
            every feature kept (:meth:`~rfgp.inference._feature_operator.FeatureOperator.
            holds_all`).
        column: the target column whose noise ``S`` holds.
        factor: ``L`` ``(N, N)``, lower triangular.

    Example:
        >>> from rfgp.inference._feature_map import FeatureMap
        >>> from rfgp.inference._feature_operator import FeatureOperator
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> fm = FeatureMap(FourierFeatureKernel(16, seed=0).double())
        >>> x = torch.rand(6, 2, dtype=torch.float64)
        >>> noise = torch.full((6, 1), 0.1, dtype=torch.float64)
        >>> op = FeatureOperator(fm, [(x, torch.zeros(6, 1, dtype=torch.float64), noise)],
        ...                      False, torch.float64, chunk=4, cache_bytes=1 << 20)
        >>> _ = op.dense(0)  # a pass keeps the features
        >>> rows = torch.rand(3, 16, dtype=torch.float64)
        >>> inverse = RowDenseInverse.build(op, 0)
        >>> from rfgp.inference._cg_dense import DenseInverse
        >>> torch.allclose(inverse.variances(rows), DenseInverse.build(op, 0).variances(rows))
        True
    """

    def __init__(self, operator, column: int, factor: Tensor) -> None:
        self.operator = operator
        self.column = column
        self.factor = factor

    @staticmethod
    def build(operator, column: int) -> Optional[RowDenseInverse]:
        """Form ``K`` with the noise of target ``column`` from the operator's kept features
        and factorise it; ``None`` where the Cholesky fails in the operator's precision."""
        with torch.no_grad():
            factor = try_cholesky(operator.row_matrix(column))
        return None if factor is None else RowDenseInverse(operator, column, factor)

    def solved(self, rows: Tensor) -> Tensor:
        r"""``(N, M)`` :math:`C = L^{-1}\Psi Q^H` of the query rows ``Q`` ``(M, W)``."""
        products = self.operator.row_products(rows, self.column)
        return torch.linalg.solve_triangular(self.factor.to(products.dtype), products,
                                             upper=False)

    def predict(self, rows: Tensor, want_root: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """The variances ``(M,)`` and with ``want_root`` the covariance ``(M, M)``."""
        solved = self.solved(rows).transpose(0, 1)
        variances = (_squared_norms(rows) - _squared_norms(solved)).clamp_min(0.0)
        if not want_root:
            return variances, None
        covariance = _real_gram(rows) - _real_gram(solved)
        return variances, covariance

    def variances(self, rows: Tensor) -> Tensor:
        r"""``(M,)`` :math:`\phi_i B^{-1} \phi_i^H` of the query rows ``(M, W)``."""
        return self.predict(rows, False)[0]


def row_precision_holds(largest: float, dtype: torch.dtype, tolerance: float) -> bool:
    r"""Whether :class:`RowDenseInverse`'s difference keeps every variance within a tenth
    of ``tolerance``: :math:`(1 + \lambda_{\max})^2\,\epsilon \le t / 10`, with
    :math:`\lambda_{\max}` (``largest``) the top eigenvalue of :math:`B - I`.

    Example:
        >>> holds = [row_precision_holds(v, torch.float64, 1e-2) for v in (1e5, 1e7)]
        >>> holds
        [True, False]
        >>> row_precision_holds(1e3, torch.float32, 1e-2)
        False
    """
    eps = torch.finfo(dtype).eps
    return (1.0 + largest) ** 2 * eps <= 0.1 * tolerance


def row_form_open(rows: int, width: int, largest: Optional[float] = None,
                  streamed: bool = False, tolerance: float = 1e-2,
                  dtype: torch.dtype = torch.float64,
                  device: Optional[torch.device] = None) -> bool:
    r"""Whether a CG fit of ``rows`` rows and ``width`` features will find the rows' form
    open, forecast before the fit: the memory's rule of
    :func:`~rfgp.inference._cg_cost.rows_route` (more features than rows, the rows in
    memory, ``K`` and its factor within a quarter of the memory), every feature kept as a
    calibrated fit keeps them (within :func:`~rfgp.inference._cg_cost.feature_cache_bytes`),
    and, where the top eigenvalue of :math:`B - I` is forecast (``largest``), the precision
    (:func:`row_precision_holds`); ``device``: the CPU by default.

    Example:
        >>> row_form_open(3000, 6144), row_form_open(3000, 2048), row_form_open(3000, 6144, 1e7)
        (True, False, False)
    """
    device = torch.device("cpu") if device is None else device
    item = torch.empty((), dtype=dtype).element_size()
    return (rows_route(rows, width, streamed, device, item)
            and rows * width * item <= feature_cache_bytes(device)
            and (largest is None or row_precision_holds(largest, dtype, tolerance)))


@dataclass
class RowsFit:
    r"""The rows' Gram matrix :math:`G = \Phi\Phi^\top` (``N x N``, float64) of a calibration
    (:func:`~rfgp.inference._calibrated_fit.calibrate_scales` where the rows' form is open),
    handed to the CG fit of the same features (:func:`fit_by_rows`), which consumes it.

    Attributes:
        gram: ``(N, N)`` :math:`G` at the kernel outputscale ``outputscale`` (the fit scales it
            in place to its own, :func:`~rfgp.inference._calibrated_fit.fit_calibrated`).
        outputscale: the outputscale ``gram`` is at.
    """

    gram: Optional[Tensor]
    outputscale: float = 1.0


def fit_by_rows(operator, given: RowsFit, groups) -> Optional[Tuple[Tensor, RowDenseInverse]]:
    r"""The mean weights of the CG fit and its variances' :class:`RowDenseInverse`, from the
    calibration's :math:`G = \Phi\Phi^\top` (of the fit's features) by one Cholesky
    factorisation: with one noise :math:`s` for every row and column,
    :math:`K = I + G / s = L L^\top` and by Woodbury's identity

    .. math::
        w = B^{-1}\Phi^\top S^{-1} y = \Phi^\top K^{-1} y / s,

    ``N^3 / 3`` multiply-adds for the factor and one pass over the features (which keeps
    them for the variances' products) in place of the CG iterations; the factor then serves
    every variance (:class:`RowDenseInverse`, the dense route the first prediction would
    have built from the same ``K``). ``None`` where this form does not apply: features in
    complex or multi-output form, a noise per row, more than one noise group, a distributed
    or streamed operator, a ``G`` of other rows, or a failed factorisation. Features the
    operator does not keep are computed again for the variances' products.

    Args:
        operator: the fit's :class:`~rfgp.inference._feature_operator.FeatureOperator`, its
            column noise set.
        given: the calibration's :class:`RowsFit`, whose ``gram`` this takes over (it is
            dropped from ``given`` whether the fit goes through it or not).
        groups: the operator's noise groups.

    Returns:
        ``(weights (W, T), RowDenseInverse)`` or ``None``.

    Example:
        >>> from rfgp.inference._feature_map import FeatureMap
        >>> from rfgp.inference._feature_operator import FeatureOperator
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> fm = FeatureMap(FourierFeatureKernel(32, seed=0).double())
        >>> x = torch.rand(10, 2, dtype=torch.float64)
        >>> y = torch.randn(10, 1, dtype=torch.float64)
        >>> op = FeatureOperator(fm, [(x, y, None)], False, torch.float64, chunk=4,
        ...                      cache_bytes=1 << 20)
        >>> op.column_noise = torch.tensor([0.1], dtype=torch.float64)
        >>> phi = fm.rows(x)
        >>> weights, _ = fit_by_rows(op, RowsFit(phi @ phi.T), op.noise_groups())
        >>> b = torch.eye(32, dtype=torch.float64) + phi.T @ phi / 0.1
        >>> torch.allclose(weights, torch.linalg.solve(b, phi.T @ y / 0.1))
        True
    """
    gram, given.gram = given.gram, None  # N^2 numbers: not kept past this call
    fm = operator.feature_map
    n = operator.num_rows
    # One noise group of column noise (None: a noise per row) is one s for every entry.
    if (operator.complex_solve or fm.is_complex or fm.outputs_per_input != 1
            or operator.distributed or operator.streamed or len(groups) != 1
            or operator.column_noise is None or gram.shape != (n, n)):
        return None
    s = float(operator.column_noise[0])
    with torch.no_grad():
        gram.div_(s).diagonal().add_(1.0)
        factor = try_cholesky(gram)
        del gram
        if factor is None:
            return None
        targets = torch.cat([t.to(torch.float64) for _, t, _ in operator.data])
        alpha = torch.cholesky_solve(targets, factor) / s
        weights = torch.zeros(operator.width, targets.shape[1], dtype=operator.vector_dtype,
                              device=operator.device)
        start = 0

        def local_pass() -> None:
            nonlocal start
            for feats, _, _ in operator.chunks():
                stop = start + feats.shape[0]
                weights.addmm_(feats.transpose(0, 1), alpha[start:stop].to(weights.dtype))
                start = stop

        operator.run(local_pass)
    return weights, RowDenseInverse(operator, 0, factor.to(operator.vector_dtype))
