r"""The calibrated fit: a feature model whose outputscale and noise maximise its own evidence.

Hyperparameters chosen for a cheaper model (a subsample, fewer features, the exact kernel on
blocks) do not belong to the ``D``-feature model that predicts: a variation its features
cannot follow is noise to it, and only its own evidence says how much. Given a kernel, data
and a solve path, :func:`calibrate_scales` finds the factor :math:`a` on the kernel's
outputscale and the noise :math:`\sigma^2` that maximise the evidence of that model, and
:func:`fit_calibrated` fits it, reusing what the calibration computed:

* ``"weight"`` (the ``D x D`` path, or ``N x N`` on fewer rows): exactly, from one
  spectrum of the Gram matrix with the targets' weights on it
  (:func:`~rfgp.inference._calibration.maximize_scale_evidence`); the fit rescales that Gram
  matrix instead of forming it again.
* ``"cg"`` (beyond the ``D x D`` path): from products with the features alone, by the Krylov
  calibration (:func:`~rfgp.inference._krylov_features.calibrate_by_krylov`: one Galerkin
  subspace of preconditioned CG runs serves every scale); the fit's conjugate gradients start
  from the calibration's Nyström preconditioner, which is that of the fit's matrix at the root.

:func:`calibrated_fit` is both steps for a user's kernel. The cost of either path, and the
path a feature count takes, are :mod:`~rfgp.inference._fit_cost`'s.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

import numpy as np
import torch
from gpytorch.kernels import AdditiveKernel, Kernel, ScaleKernel
from torch import Tensor

from rfgp._data import (
    DEFAULT_CHUNK_ROWS,
    DataSource,
    ShardedSource,
    all_reduce_sum,
    gather_checked,
)
from rfgp._parameters import PARAMETER_CONSTRAINTS
from rfgp._validation import check_evidence_rows, validate_parameters
from rfgp.inference._calibration import (
    feature_model_evidence,
    kernel_outputscale,
    maximize_scale_evidence,
    spectral_statistics,
)
from rfgp.inference._cg_cost import feature_cache_bytes, final_path, rows_route
from rfgp.inference._cg_rows import RowsFit, row_precision_holds
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._feature_operator import FeatureOperator, SourceRows
from rfgp.inference._iterative import CGSettings
from rfgp.inference._krylov_calibration import KrylovCalibration
from rfgp.inference._krylov_features import (
    calibrate_by_krylov,
    calibrate_by_rows,
    calibrate_operator_by_krylov,
)
from rfgp.inference._prior_mean import adopt_prior_mean, check_prior_mean
from rfgp.inference._statistics import accumulate_gram, symmetrize_upper
from rfgp.kernels._composition import feature_kernel

__all__ = ["ScaleCalibration", "calibrate_scales", "calibrate_source_scales", "calibrated_fit",
           "fit_calibrated", "fit_calibrated_source", "stream_fit"]

# The smallest noise, relative to the largest eigenvalue of the model's (scaled) Gram matrix,
# at which its weight-space matrix still factorises reliably in the dtype.
_CONDITION = {torch.float64: 1e-10, torch.float32: 1e-5}
# The weight path's statistics are summed and factorised in float64 whatever the features'
# dtype: the Gram matrix's largest eigenvalue grows like N, so float32's bound above would
# hold the noise above 1e-5 N times the signal variance, a floor that binds from a few
# thousand rows on and turns what the features could fit into noise.
_WEIGHT_DTYPE = torch.float64


@dataclass
class ScaleCalibration:
    """The outcome of :func:`calibrate_scales`.

    Attributes:
        path: ``"weight"`` or ``"cg"``, the path of the calibration and of the fit.
        factor: :math:`a`, the factor on the kernel's outputscale.
        noise: :math:`\\sigma^2`.
        loss: :math:`-\\log p(y)` at ``(factor, noise)`` (an estimate on the ``"cg"`` path).
        reuse: what the fit of the calibrated model takes over: ``(Z^T Z, Z^T Y,
            outputscale)`` of the features (``"weight"``), the Nyström preconditioner of the
            fit's matrix or the rows' Gram matrix (``"cg"``, a
            :class:`~rfgp.inference._cg_rows.RowsFit` where it calibrated through the rows);
            ``None``: the fit computes its own.
        iterative: the Krylov calibration's record (``"cg"`` only; its ``products`` count
            the column products with the Gram matrix by purpose).
        column_squares: ``(T,)`` each target column's :math:`y_t^\\top y_t` in the
            calibration's units, where ``reuse`` was summed over a source's chunks (the fit
            has no rows to read them from).
        spectrum: ``(D,)`` the eigenvalues of :math:`\\Phi^\\top\\Phi` at the kernel's
            outputscale (``"weight"`` path in weight space; ``None`` otherwise): with
            ``factor / noise`` they forecast a larger model's CG iterations
            (:func:`~rfgp.inference._cg_forecast.forecast_cg`).
    """

    path: str
    factor: float
    noise: float
    loss: float = math.nan
    reuse: Any = None
    iterative: Optional[KrylovCalibration] = None
    column_squares: Optional[Tensor] = None
    spectrum: Optional[Tensor] = None


def calibrate_scales(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                     path: str = "weight", factor: float = 1.0, noise_floor: float = 0.0,
                     keep: bool = True, seed: int = 0,
                     rows: Optional[bool] = None) -> ScaleCalibration:
    r"""The outputscale factor :math:`a` and noise :math:`\sigma^2 \ge \sigma^2_0` that maximise
    the evidence of ``kernel``'s feature model on ``(x, y)``, started at ``(factor, noise)``.
    The noise also stays above :math:`c\, a \lambda_{\max}(G)`, so that the fit's matrix
    :math:`a G / \sigma^2 + I` factorises: a target the features fit exactly would otherwise
    drive the noise to its floor. On the ``"weight"`` path the evidence is summed and the fit
    factorised in float64 whatever ``x``'s dtype (:math:`c = 10^{-10}`); on the ``"cg"`` path
    the products are in ``x``'s dtype (:math:`c = 10^{-5}` in float32).

    Args:
        kernel: a random-feature kernel (or a ``ScaleKernel``, or a sum of such) at the
            lengthscales to calibrate; its outputscale is the reference of ``factor``.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` centred targets.
        noise: the starting noise (positive); factor: the starting factor (positive).
        path: ``"weight"`` (exact, one spectrum of the Gram matrix) or ``"cg"`` (feature products).
        noise_floor: :math:`\sigma^2_0`.
        keep: keep the Gram matrix for the fit (``"weight"``; ``False`` frees it at once).
        seed: the seed of the iterative calibration's probes and sketch.
        rows: on the ``"cg"`` path, whether to calibrate (and with ``keep`` to fit) through
            the rows' ``N x N`` form where it is open (:func:`rows_route_open`); ``None``:
            wherever it is open. The recipe weighs the two routes' costs
            (:func:`~rfgp.recipes._final_cost.cg_route_costs`).

    Returns:
        A :class:`ScaleCalibration`.

    Example:
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(500, 1, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(500, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(256, sampling="orthogonal", seed=0)).double()
        >>> k.base_kernel.lengthscale = 0.2
        >>> calibration = calibrate_scales(k, x, y - y.mean(), 1.0)
        >>> 0.005 < calibration.noise < 0.02, calibration.path
        (True, 'weight')
    """
    if path == "cg":  # products with the features in their own dtype
        condition = _CONDITION[x.dtype]
        if rows is not False and rows_route_open(x, kernel):
            return _calibrate_by_rows(kernel, x, y, noise, factor, noise_floor, condition,
                                      keep, seed)
        result = calibrate_by_krylov(
            kernel, x, y, noise, factor=factor, noise_floor=noise_floor, condition=condition,
            cache_bytes=_cache_bytes(x, kernel), generator=torch.Generator().manual_seed(seed))
        return ScaleCalibration("cg", result.factor, result.noise,
                                -result.log_evidence * y.numel(), result.preconditioner, result)
    condition = _CONDITION[_WEIGHT_DTYPE]
    products: Optional[list] = [] if keep else None
    evidence = feature_model_evidence(kernel, x, y, products)
    factor, noise, loss = maximize_scale_evidence(evidence, noise, noise_floor,
                                                  factor_start=factor, condition=condition)
    return ScaleCalibration("weight", factor, noise, loss, products[0] if products else None,
                            spectrum=_weight_spectrum(evidence))


def rows_route_open(x: Tensor, kernel: Kernel) -> bool:
    """Whether the ``"cg"`` path calibrates and fits ``kernel``'s features on ``x`` through
    the rows' ``N x N`` form (:func:`~rfgp.inference._krylov_features.calibrate_by_rows`,
    :func:`~rfgp.inference._cg_rows.fit_by_rows`): float64 inputs, real features of one
    output per input (the fit through the rows takes no other), and the rows' route open
    (:func:`~rfgp.inference._cg_cost.rows_route`: more real features than rows, ``N x N``
    matrices within the memory; features beyond the cache are computed again)."""
    fm = FeatureMap(feature_kernel(kernel))
    return (x.dtype == torch.float64 and not fm.is_complex and fm.outputs_per_input == 1
            and rows_route(x.shape[0], fm.num_real_features, device=x.device))


def _calibrate_by_rows(kernel: Kernel, x: Tensor, y: Tensor, noise: float, factor: float,
                       noise_floor: float, condition: float, keep: bool,
                       seed: int) -> ScaleCalibration:
    """The ``"cg"`` path's calibration through the rows (:func:`rows_route_open`); with
    ``keep`` its ``G`` goes to the fit (:class:`~rfgp.inference._cg_rows.RowsFit`) where the
    rows' factor keeps the variances' precision at the root
    (:func:`~rfgp.inference._cg_rows.row_precision_holds` on the top eigenvalue of ``c G``),
    else the fit runs CG from a sketch of its own."""
    result, gram = calibrate_by_rows(
        kernel, x, y, noise, factor=factor, noise_floor=noise_floor, condition=condition,
        cache_bytes=_cache_bytes(x, kernel), generator=torch.Generator().manual_seed(seed))
    pre = result.preconditioner
    top = float(pre.eigenvalues.max()) if pre is not None and pre.rank else 0.0
    reuse = None
    if keep and row_precision_holds(top, torch.float64, CGSettings.variance_tolerance):
        reuse = RowsFit(gram, kernel_outputscale(kernel))
    del gram
    return ScaleCalibration("cg", result.factor, result.noise,
                            -result.log_evidence * y.numel(), reuse, result)


def _weight_spectrum(evidence: Any) -> Optional[Tensor]:
    """The Gram matrix's eigenvalues of a weight-space evidence (``None`` in function space,
    whose eigenvalues are the ``N x N`` kernel matrix's)."""
    return evidence.eigenvalues if evidence.weight_space else None


def fit_calibrated(kernel: Kernel, x: Tensor, y: Tensor, calibration: ScaleCalibration,
                   target_unit: float = 1.0) -> RandomFeatureGP:
    r"""Fit the calibrated model: ``kernel`` at the calibrated outputscale (``a`` times the
    calibration's), noise :math:`\sigma^2 u^2`, on ``(x, y)`` whose targets are ``target_unit``
    :math:`= u` times those the calibration saw, by the calibration's path, reusing what it
    computed. The calibration's Gram matrix and projections serve where ``kernel`` has the same
    features up to the outputscale (they scale by the square root of the outputscales' ratio,
    read from the kernels, so the outputscale constraint's rounding is followed) and the inputs
    are the calibration's or a power-of-two rescaling of them (exact).

    Args:
        kernel: the final kernel, its outputscale already times ``calibration.factor``.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` targets.
        calibration: from :func:`calibrate_scales` on the same features (its ``reuse`` is
            consumed: the Gram matrix is scaled in place).
        target_unit: :math:`u`.

    Returns:
        The fitted :class:`~rfgp.RandomFeatureGP` (``solve="cg"`` on the ``"cg"`` path).
    """
    noise = torch.as_tensor(calibration.noise, dtype=x.dtype) * target_unit**2
    options = ({"solve": "cg", "cache_bytes": _cache_bytes(x, kernel)}
               if calibration.path == "cg" else {"statistics_dtype": _WEIGHT_DTYPE})
    gp = RandomFeatureGP(kernel, noise=noise, **options)
    with torch.no_grad():
        reuse = calibration.reuse
        if isinstance(reuse, RowsFit):
            reuse.gram.mul_(kernel_outputscale(kernel) / reuse.outputscale)
        if isinstance(reuse, tuple):
            gram, rhs, outputscale = reuse
            ratio = kernel_outputscale(kernel) / outputscale
            reuse = gram.mul_(ratio), rhs * (math.sqrt(ratio) * target_unit)
        gp._fit_batches([(x, y, None)], None, reuse=reuse)
    return _with_known_evidence(gp, calibration, y.numel(), target_unit)


def _with_known_evidence(gp: RandomFeatureGP, calibration: ScaleCalibration, entries: int,
                         target_unit: float) -> RandomFeatureGP:
    r"""``gp`` (fitted by CG at ``calibration``'s root) with the Krylov calibration's estimate
    of its log evidence, which its ``log_marginal_likelihood()`` then serves: the estimate is
    per datum in the calibration's units, so the fit's (targets ``u`` times those, ``entries``
    data) is :math:`n\,(\ell - \log u)`, its standard error :math:`n\,s`. A new stochastic
    estimate would cost a Lanczos run per probe (8.6 s on 13,500 rows at 7,168 features)."""
    result = calibration.iterative
    if calibration.path == "cg" and result is not None:
        gp._state.solver.known_evidence = (
            entries * (result.log_evidence - math.log(target_unit)),
            entries * result.standard_error)
    return gp


def calibrate_source_scales(kernel: Kernel, source: DataSource, noise: float, *,
                            x_unit: Any = 1.0, y_unit: float = 1.0, noise_floor: float = 0.0,
                            keep: bool = True, path: str = "weight", factor: float = 1.0,
                            seed: int = 0) -> ScaleCalibration:
    r""":func:`calibrate_scales` on every row of a :class:`~rfgp._data.DataSource` (a
    memory-map, chunks, process shards) that is not held in memory, the rows' inputs over
    ``x_unit`` and targets over ``y_unit``, in chunks of :data:`~rfgp._data.DEFAULT_CHUNK_ROWS`
    rows (the in-memory chunks, so the sums round alike), summed across processes for a
    :class:`~rfgp._data.ShardedSource`:

    * ``"weight"``: :math:`\Phi^\top\Phi` and :math:`\Phi^\top y` summed in float64. With
      ``keep`` the sums (and each target column's :math:`y_t^\top y_t`) are kept for
      :func:`fit_calibrated_source`; on fewer rows than features the rows are read and the
      ``N x N`` form is used (nothing kept). Memory ``O(chunk * D + D^2)``, one pass.
    * ``"cg"``: the Krylov calibration from ``factor`` (probes and sketch drawn from ``seed``)
      with every product :math:`G V` one pass over the rows, never held
      (:func:`~rfgp.inference._krylov_features.calibrate_operator_by_krylov` on
      :class:`~rfgp.inference._feature_operator.SourceRows`); its preconditioner is kept for
      the fit. Memory ``O(chunk * D + D k)`` for the ``k`` columns of the sketch and runs.
    """
    if path == "cg":  # the fit's products are in the rows' dtype
        condition = _CONDITION[source.dtype]
        rows = SourceRows(source, torch.float64, x_unit, y_unit)
        sharded = isinstance(source, ShardedSource)
        op = FeatureOperator(FeatureMap(feature_kernel(kernel)), rows, False, torch.float64,
                             DEFAULT_CHUNK_ROWS, 0, source.group if sharded else None, sharded)
        op.column_noise = torch.ones(op.num_columns, dtype=torch.float64)
        squares = float(op.target_squares().sum())
        result = calibrate_operator_by_krylov(
            op, squares, source.num_rows, noise, factor=factor, noise_floor=noise_floor,
            condition=condition, generator=torch.Generator().manual_seed(seed))
        return ScaleCalibration("cg", result.factor, result.noise,
                                -result.log_evidence * source.num_rows * op.num_columns,
                                result.preconditioner, result)
    condition = _CONDITION[_WEIGHT_DTYPE]
    feature_map = FeatureMap(feature_kernel(kernel))
    width = feature_map.num_real_features
    if source.num_rows < width:  # the N x N form: few rows, read them
        x, y = source.load()
        evidence = feature_model_evidence(kernel, x / x_unit, y / y_unit)
        factor, noise, loss = maximize_scale_evidence(evidence, noise, noise_floor,
                                                      condition=condition)
        return ScaleCalibration("weight", factor, noise, loss)
    columns = max(1, int(np.prod(source.target_shape)))
    gram = torch.zeros(width, width, dtype=torch.float64)
    rhs = torch.zeros(width, columns, dtype=torch.float64)
    squares = torch.zeros(columns, dtype=torch.float64)

    def accumulate() -> None:
        with torch.no_grad():
            for x, y in source.chunks(DEFAULT_CHUNK_ROWS):
                z = feature_map.real_rows(x / x_unit).to(torch.float64)
                targets = (y / y_unit).reshape(x.shape[0], -1).to(torch.float64)
                accumulate_gram(gram, z)
                rhs.add_(z.transpose(0, 1) @ targets)
                squares.add_(targets.square().sum(0))

    if isinstance(source, ShardedSource):
        gather_checked(accumulate, source.group)
        gram, rhs, squares = (all_reduce_sum(total, source.group)
                              for total in (gram, rhs, squares))
    else:
        accumulate()
    gram = symmetrize_upper(gram)
    evidence = spectral_statistics(gram, rhs, float(squares.sum()), source.num_rows)
    factor, noise, loss = maximize_scale_evidence(evidence, noise, noise_floor,
                                                  condition=condition)
    if not keep:
        return ScaleCalibration("weight", factor, noise, loss, spectrum=evidence.eigenvalues)
    return ScaleCalibration("weight", factor, noise, loss,
                            (gram, rhs, kernel_outputscale(kernel)), column_squares=squares,
                            spectrum=evidence.eigenvalues)


def fit_calibrated_source(kernel: Kernel, source: DataSource, calibration: ScaleCalibration,
                          like: tuple, target_unit: float = 1.0) -> RandomFeatureGP:
    r""":func:`fit_calibrated` on the rows of ``source`` (the data's units, ``target_unit``
    :math:`= u` times the calibration's targets). On the ``"cg"`` path by CG over the rows,
    read at every product (one pass per iteration), from the calibration's preconditioner.
    In weight space: from the calibration's sums of
    :func:`calibrate_source_scales` without another pass over the rows (its statistics are
    those sums, each target column's :math:`y_t^\top y_t` and ``N``: what a fit on the rows
    would sum, so the model is that fit's to rounding), or, where it kept none,
    :func:`stream_fit`. ``like``: ``(x, y)`` of one row (or more) as the fit would read them,
    for the layout, the dtype and any lazily drawn weights.
    """
    noise = torch.as_tensor(calibration.noise, dtype=like[0].dtype) * target_unit**2
    if calibration.path == "cg":
        gp = RandomFeatureGP(kernel, noise=noise, solve="cg", cache_bytes=0)
        with torch.no_grad():
            gp._fit_source(source, like, calibration.reuse)
        columns = 1 if like[1].dim() == 1 else like[1].shape[-1]
        return _with_known_evidence(gp, calibration, source.num_rows * columns, target_unit)
    gp = RandomFeatureGP(kernel, noise=noise, solve="weight", statistics_dtype=_WEIGHT_DTYPE)
    with torch.no_grad():
        if not isinstance(calibration.reuse, tuple):
            return stream_fit(gp, source)
        gram, rhs, outputscale = calibration.reuse
        ratio = kernel_outputscale(kernel) / outputscale
        squares = calibration.column_squares * target_unit**2
        return gp._fit_sums(like[0][:1], like[1][:1], gram.mul_(ratio),
                            rhs * (math.sqrt(ratio) * target_unit), squares, source.num_rows)


def stream_fit(gp: RandomFeatureGP, source: DataSource) -> RandomFeatureGP:
    """``gp.fit_stream`` over every row of ``source`` (the data's units), all-reduced across
    processes for a :class:`~rfgp._data.ShardedSource`. A read that fails on one rank stops
    that rank's stream; every rank then raises after the fit's collectives, instead of
    waiting."""
    if not isinstance(source, ShardedSource):
        return gp.fit_stream(source.chunks(DEFAULT_CHUNK_ROWS))
    chunks = source.chunks(DEFAULT_CHUNK_ROWS)
    first: List[Any] = []
    # The first chunk is read before the fit's first collective (its weights' broadcast).
    gather_checked(lambda: first.append(next(chunks)), source.group)
    failures: List[BaseException] = []

    def guarded() -> Iterator[Any]:
        try:
            yield from chunks
        except Exception as error:  # raised on every rank once the fit's collectives are done
            failures.append(error)

    gp.fit_stream(itertools.chain(first, guarded()), distributed=True,
                  process_group=source.group)

    def check() -> None:
        if failures:
            raise failures[0]

    gather_checked(check, source.group)
    return gp


def _cache_bytes(x: Tensor, kernel: Kernel) -> int:
    """Bytes of feature rows an iterative fit keeps: all ``N x width`` of them, up to a
    quarter of the memory (the rest are recomputed at every product)."""
    width = FeatureMap(feature_kernel(kernel)).num_real_features
    whole = x.shape[0] * width * x.element_size()
    return int(min(whole, feature_cache_bytes(x.device)))


def calibrated_fit(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                   solve: str = "auto", noise_floor: float = 0.0,
                   seed: int = 0, prior_mean: Any = 0.0) -> RandomFeatureGP:
    r"""Fit ``kernel``'s feature model with its outputscale and noise chosen by its own
    evidence: the rule of :func:`~rfgp.recipes.fit_auto`'s last stage, for lengthscales found
    elsewhere. With :math:`D` features the factor :math:`a` on the outputscale and the noise
    :math:`\sigma^2` maximise :math:`\log p(y)` of that :math:`D`-feature model; up to 8192
    features (``solve="weight"``) exactly, from one spectrum of its Gram matrix,
    beyond (``solve="cg"``) from products with its features alone (a stochastic estimate whose
    error is far below the evidence's curvature). With more features than rows, where the
    rows' ``N x N`` matrix :math:`\Phi\Phi^\top` fits (:func:`rows_route_open`), the
    ``"cg"`` path forms it once (``N^2 D / 2`` multiply-adds), calibrates on products with it
    and fits by one Cholesky factor of :math:`I + c\,\Phi\Phi^\top`, the exact posterior of
    the calibrated model, whose factor then serves every predictive variance.

    Args:
        kernel: a ``ScaleKernel`` around a random-feature kernel, or a sum of such (e.g.
            ``gp.kernel`` of a model from :func:`~rfgp.recipes.fit_auto`); copied, not changed.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` targets.
        noise: the starting noise (positive).
        solve: ``"auto"`` (the weight space up to 8192 features, CG beyond), ``"weight"`` or
            ``"cg"``.
        prior_mean: the model's constant prior mean (a number, or one value per target
            column; e.g. ``gp.prior_mean`` of a model from :func:`~rfgp.recipes.fit_auto`):
            the calibration and the fit are those of ``y - prior_mean``, and the model
            returned carries it.
        noise_floor: the noise's lower bound (a finite number >= 0); where it binds, the
            outputscale maximises the evidence with the noise held at it.
        seed: the seed of the iterative calibration's probes, an integer in
            ``[0, 2**64 - 1]``.

    Returns:
        The fitted :class:`~rfgp.RandomFeatureGP` (``solve="cg"`` on the iterative path).

    Raises:
        ValueError: for ``y`` zero in every entry (the evidence then has no maximum), and for
            any argument out of its range, naming it; TypeError for one of the wrong type.

    Example:
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(500, 1, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(500, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(256, sampling="orthogonal", seed=0)).double()
        >>> k.base_kernel.lengthscale = 0.2
        >>> gp = calibrated_fit(k, x, y - y.mean(), noise=1.0)
        >>> 0.005 < float(gp.noise) < 0.02
        True
    """
    checked = validate_parameters(PARAMETER_CONSTRAINTS["calibrated_fit"], {
        "kernel": kernel, "noise": noise, "solve": solve, "noise_floor": noise_floor,
        "seed": seed, "prior_mean": prior_mean})
    noise, solve, noise_floor, seed = (checked[name] for name in (
        "noise", "solve", "noise_floor", "seed"))
    x, y = check_evidence_rows(x, y, "calibrated_fit")
    mean = check_prior_mean(prior_mean)
    columns = 1 if y.dim() == 1 else y.shape[1]
    if mean.dim() and mean.numel() != columns:
        raise ValueError(f"prior_mean must hold one value per target column ({columns}), got "
                         f"{mean.numel()}")
    y = y - mean.to(y)
    kernel = copy.deepcopy(kernel)
    parts = kernel.kernels if isinstance(kernel, AdditiveKernel) else [kernel]
    odd = [type(part).__name__ for part in parts if not isinstance(part, ScaleKernel)]
    if odd:  # the terms of a sum
        raise TypeError(
            "kernel must be a ScaleKernel around a random-feature kernel, or a sum of such "
            f"(its outputscale is calibrated), got a sum with a term {odd[0]}"
        )
    width = FeatureMap(feature_kernel(kernel)).num_real_features
    path = final_path(x.shape[0], width, x.shape[1], solve, forced=True)[0]
    with torch.no_grad():
        calibration = calibrate_scales(kernel, x, y, noise, path=path,
                                       noise_floor=noise_floor, seed=seed)
        for part in parts:
            part.outputscale = part.outputscale * calibration.factor
    gp = fit_calibrated(kernel, x, y, calibration)
    if bool(mean.any()):
        adopt_prior_mean(gp, mean)
    return gp
