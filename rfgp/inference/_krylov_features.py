r"""The Krylov calibration (:func:`~rfgp.inference._krylov_calibration.krylov_scale_calibration`)
on a kernel's random features: :func:`calibrate_by_krylov` on products with
:math:`G = \Phi^\top\Phi` by passes over the rows' features (:func:`calibrate_operator_by_krylov`
on any :class:`~rfgp.inference._feature_operator.FeatureOperator`, rows in memory or behind a
data source), and :func:`calibrate_by_rows` on products with the rows' ``N x N``
:math:`\Phi\Phi^\top`, formed once, where there are more features than rows.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator
from rfgp.inference._krylov_calibration import (
    PROBE_TOLERANCE,
    KrylovCalibration,
    krylov_scale_calibration,
)
from rfgp.kernels._composition import feature_kernel

__all__ = ["calibrate_by_krylov", "calibrate_by_rows", "calibrate_operator_by_krylov"]

# Rows of features formed at once.
_CHUNK_ROWS = 4096


def calibrate_by_krylov(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                        factor: float = 1.0, noise_floor: float = 0.0,
                        condition: float = 0.0, num_probes: int = 8,
                        rank: Optional[int] = None, cache_bytes: int = 1 << 30,
                        tolerance: float = 1e-8, probe_tolerance: float = PROBE_TOLERANCE,
                        max_runs: int = 4, generator: Optional[torch.Generator] = None
                        ) -> KrylovCalibration:
    r"""The outputscale factor and noise that maximise the evidence of ``kernel``'s feature
    model on ``(x, y)``, by :func:`krylov_scale_calibration` on products with its features
    over row chunks (the ``N x D`` matrix is kept only as far as ``cache_bytes`` allows).

    Args:
        kernel: a random-feature kernel (or a ``ScaleKernel`` around one, or a sum of such)
            with its hyperparameters set; its outputscale is the reference of ``factor``.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` centred targets.
        noise, factor, noise_floor, condition, num_probes, rank, tolerance,
            probe_tolerance, max_runs, generator: as in :func:`krylov_scale_calibration`.
        cache_bytes: bytes of feature rows kept across the products.

    Returns:
        A :class:`KrylovCalibration`.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> from gpytorch.kernels import ScaleKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(2000, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(2000, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(256, ard_num_dims=2, seed=0)).double()
        >>> k.base_kernel.lengthscale = 0.3
        >>> out = calibrate_by_krylov(k, x, y - y.mean(), 0.1, generator=g)
        >>> 0.005 < out.noise < 0.02
        True
    """
    op, columns = _target_operator(kernel, x, y, cache_bytes)
    return calibrate_operator_by_krylov(
        op, float(columns.square().sum()), x.shape[0], noise, factor=factor,
        noise_floor=noise_floor,
        condition=condition, num_probes=num_probes, rank=rank, tolerance=tolerance,
        probe_tolerance=probe_tolerance, max_runs=max_runs, generator=generator)


def calibrate_by_rows(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                      cache_bytes: int = 1 << 30, **options) -> Tuple[KrylovCalibration, Tensor]:
    r""":func:`calibrate_by_krylov` in the rows' form: :math:`G = \Phi\Phi^\top` (``N x N``)
    formed once from the features (``N^2 W / 2`` multiply-adds, block by block), then the
    Krylov calibration on products with it (``function_space``), each ``N^2`` multiply-adds
    in place of two passes over the ``N x W`` features. With more features than rows
    (``W > N``) the products are cheaper by ``2 W / N`` and read ``N^2`` numbers instead of
    twice ``N W``; the ``G`` formed is that of the fit's rows' factor
    (:func:`~rfgp.inference._cg_rows.fit_by_rows`), which the variances would form anyway.

    Args:
        kernel, x, y, noise: as in :func:`calibrate_by_krylov`.
        cache_bytes: bytes of feature rows kept while ``G`` is formed (every row's are held
            while it is: the caller has checked them against the memory).
        **options: as in :func:`krylov_scale_calibration`.

    Returns:
        ``(KrylovCalibration, G)``: its ``preconditioner`` is of the rows' ``I + c G``.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> from gpytorch.kernels import ScaleKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(300, 2, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(300, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(512, ard_num_dims=2, seed=0)).double()
        >>> k.base_kernel.lengthscale = 0.3
        >>> out, gram = calibrate_by_rows(k, x, y - y.mean(), 0.1, generator=g)
        >>> 0.005 < out.noise < 0.02, tuple(gram.shape)
        (True, (300, 300))
    """
    op, columns = _target_operator(kernel, x, y, cache_bytes)
    op.column_noise = torch.ones(1, dtype=torch.float64, device=columns.device)
    with torch.no_grad():
        gram = op.row_matrix(0)
        del op  # the features: G holds all the calibration and the fit need of them
        gram.diagonal().sub_(1.0)
        result = krylov_scale_calibration(lambda v: gram @ v, columns,
                                          float(columns.square().sum()), x.shape[0], noise,
                                          function_space=True, **options)
    return result, gram


def _target_operator(kernel: Kernel, x: Tensor, y: Tensor,
                     cache_bytes: int) -> Tuple[FeatureOperator, Tensor]:
    """The real-form float64 feature operator of ``kernel`` on ``x`` with ``y``'s columns as
    its targets ``(N, T)``, and those columns."""
    columns = y.reshape(x.shape[0], -1).to(torch.float64)
    op = FeatureOperator(FeatureMap(feature_kernel(kernel)), [(x, columns, None)], False,
                         torch.float64, _CHUNK_ROWS, cache_bytes)
    return op, columns


def calibrate_operator_by_krylov(operator: FeatureOperator, target_squares: float,
                                 num_rows: int, noise: float, **options) -> KrylovCalibration:
    r""":func:`krylov_scale_calibration` on the products of ``operator``: real-form float64
    features over rows whose targets are its target columns (they are read for
    :math:`b = \Phi^\top y` in one pass), its column noise set to 1, so that its
    :meth:`~rfgp.inference._feature_operator.FeatureOperator.gram` is :math:`G V`.

    Args:
        operator: the rows (in memory, or :class:`~rfgp.inference._feature_operator.SourceRows`
            of a data source: then every product is one pass over the source).
        target_squares: :math:`\sum_t y_t^\top y_t` over every row (of every process).
        num_rows: ``N`` (of every process).
        noise, **options: as in :func:`krylov_scale_calibration`.
    """
    operator.column_noise = torch.ones(operator.num_columns, dtype=torch.float64,
                                       device=operator.device)
    with torch.no_grad():
        b = operator.project(lambda targets, _: targets, operator.num_columns)  # (W, T)
    return krylov_scale_calibration(lambda v: operator.gram(v, [0] * v.shape[1]), b,
                                    target_squares, num_rows, noise, **options)
