r"""The final fit: the hyperparameters belong to the model that predicts.

The final kernel has the schedule's ``D`` features (the Laplace average of the lengthscales
where there are draws, :func:`~rfgp.recipes.lengthscale_mixture_kernel`), on the
data as given. **Rule:** its outputscale and noise maximise the evidence of that
``D``-feature model itself (:mod:`~rfgp.recipes._calibration`: one eigendecomposition of its
Gram matrix, then :math:`O(D)` per evaluation), and where the search stages left more than one
candidate lengthscale vector (the refinement's end, the local stage's best) the evidence of
the same model with at most :data:`~rfgp.recipes._schedule.CHOICE_FEATURES` features (each
calibrated) chooses among them. The fit then reuses the chosen model's Gram matrix. The
search's hyperparameters belong to cheaper models (a
subsample, :math:`D_s` features, or the exact kernel on blocks): a variation that ``D``
features cannot follow is noise to the final model, and only its own evidence says how much.
The lengthscales themselves are not moved at ``D``: each evaluation of that evidence's
gradient costs :math:`2 N D^2`, more than the whole calibration, and a few such steps buy less
than the same time spent on more features or on the local stage.

Where the schedule's final path is ``"cg"`` (``D`` beyond the ``D x D`` path), the candidates
are chosen, and the scales started, by the evidence of a
:data:`~rfgp.recipes._schedule.CHOICE_FEATURES`-feature model; the ``D``-feature model's own
scales then come from :func:`~rfgp.recipes._iterative_calibration.calibrate_by_products`, and it
is fitted by conjugate gradients.
"""

from __future__ import annotations

import copy
import math
from typing import Dict, Optional

import torch
from gpytorch.kernels import AdditiveKernel, Kernel, ScaleKernel
from torch import Tensor

from rfgp._validation import check_choice, check_positive
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._feature_map import FeatureMap
from rfgp.inference._linalg import available_memory
from rfgp.inference._statistics import accumulate_gram, symmetrize_upper
from rfgp.kernels._composition import feature_kernel
from rfgp.recipes._averaging import lengthscale_mixture_kernel
from rfgp.recipes._calibration import (
    ScaleEvidence,
    kernel_spectral_statistics,
    maximize_scale_evidence,
    spectral_statistics,
)
from rfgp.recipes._context import RecipeContext
from rfgp.recipes._iterative_calibration import calibrate_by_products
from rfgp.recipes._schedule import CHOICE_FEATURES, final_path
from rfgp.recipes._start import make_ard_kernel, set_hyperparameters
from rfgp.recipes._streaming import fit_from_products, source_evidence, stream_fit
from rfgp.recipes._units import NOISE_FLOOR, check_recipe_data

__all__ = ["calibrated_fit", "feature_model_evidence", "refit_stage"]

# Rows of features formed at once for the Gram matrix: a few hundred MB at D = 8192.
_CHUNK_ROWS = 4096
# The smallest noise, relative to the largest eigenvalue of the final model's (scaled) Gram
# matrix, at which its weight-space matrix still factorises reliably in the dtype.
_CONDITION = {torch.float64: 1e-10, torch.float32: 1e-5}


def feature_model_evidence(kernel: Kernel, x: Tensor, y: Tensor,
                           products: Optional[list] = None) -> ScaleEvidence:
    """The spectral statistics of ``kernel``'s feature model on ``(x, y)``: its Gram matrix
    accumulated over row chunks in float64 and factorised (the kernel matrix on fewer rows
    than features). A ``products`` list receives ``(Z^T Z, Z^T Y, outputscale)`` (weight
    space only; the outputscale ``Z`` was formed at), so that a fit of the same features at
    another outputscale need not form them again (:func:`_rescaled_products`).

    Example:
        >>> k = make_ard_kernel(64, 2, seed=0)
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
        for start in range(0, n, _CHUNK_ROWS):
            z = feature_map.real_rows(x[start:start + _CHUNK_ROWS]).to(torch.float64)
            accumulate_gram(gram, z)
            rhs += z.transpose(0, 1) @ columns[start:start + _CHUNK_ROWS]
        gram = symmetrize_upper(gram)
    if products is not None:
        products.append((gram, rhs, _outputscale(kernel)))
    return spectral_statistics(gram, rhs, float(columns.square().sum()), n)


def _final_kernel(ctx: RecipeContext, centre: Tensor, outputscale: Tensor,
                  data_units: bool, features: int = 0) -> Kernel:
    """The final kernel at the search-unit lengthscales ``centre`` and outputscale, in the
    search's units or (``data_units``) the data's, with ``features`` (default the
    schedule's)."""
    opts, features = ctx.options, features or ctx.schedule.num_features
    if data_units:
        centre, outputscale = centre * ctx.x_unit, outputscale * ctx.y_unit**2
    lengthscale = centre
    if ctx.draws is not None:
        return lengthscale_mixture_kernel(features, ctx.draws * lengthscale, outputscale,
                                          opts.spectral, opts.seed)
    kernel = make_ard_kernel(features, ctx.input_dim, opts.spectral, seed=opts.seed,
                             dtype=ctx.x.dtype).to(ctx.x.device)
    set_hyperparameters(kernel, lengthscale, outputscale)
    return kernel


def refit_stage(ctx: RecipeContext) -> RandomFeatureGP:
    """Build, calibrate and fit the final model (module docstring)."""
    report = ctx.report
    iterative = ctx.schedule.final_solve == "cg"
    with ctx.stage("refit"):
        # The evidence is computed in the search's units: power-of-two units scale every
        # result exactly, and the final kernel is then built in the data's.
        outputscale = ctx.model.kernel.outputscale.detach()
        noise = float(ctx.model.noise.detach())
        # Without calibration the searched model is kept as it is.
        candidates: Dict[str, Tensor] = (dict(ctx.candidates) if ctx.options.calibrate
                                         else {}) or {"search": ctx.lengthscale()}
        best = ("search", ctx.lengthscale(), 1.0, noise)
        # The best candidate's Gram matrix and projections, kept for the final fit (weight
        # space): its features are those of the evidence, rescaled exactly.
        kept: list = []
        losses = {}
        shift = math.log(ctx.y_unit)  # a log density per datum in the data's units
        floor = NOISE_FLOOR * ctx.mean_square()
        entries = ctx.num_rows * (ctx.y.numel() // ctx.y.shape[0])
        condition = _CONDITION[ctx.x.dtype]
        # Several candidates are compared at no more than CHOICE_FEATURES features (the
        # chosen one then calibrates at the final D): on the iterative path always, on the
        # weight path where D is larger.
        features = ctx.schedule.num_features
        several = ctx.options.calibrate and len(candidates) > 1
        choice = (min(features, CHOICE_FEATURES)
                  if iterative or (several and features > CHOICE_FEATURES) else 0)
        for name, centre in candidates.items():
            if not ctx.options.calibrate:
                break
            kernel = _final_kernel(ctx, centre, outputscale, False, choice)
            products: list = []
            evidence = _model_evidence(ctx, kernel, None if iterative or choice else products)
            # The solve factors B = a G / noise + I: a noise below the largest eigenvalue
            # times the dtype's usable condition leaves B unfactorisable (a nearly
            # noise-free target), so the noise is kept above it.
            factor, calibrated, loss = maximize_scale_evidence(evidence, noise, floor,
                                                               condition=condition)
            losses[name] = loss / entries + shift
            if len(losses) == 1 or losses[name] < losses[best[0]]:
                best, kept = (name, centre, factor, calibrated), products
            del products, evidence
        name, centre, factor, calibrated = best
        if choice and not iterative:
            # The chosen lengthscales' D-feature model calibrates itself, from the search's
            # scales as every candidate did (the fewer features' outputscale factor can be
            # far from its own); its Gram matrix then serves the fit.
            kernel = _final_kernel(ctx, centre, outputscale, False)
            evidence = _model_evidence(ctx, kernel, kept)
            factor, calibrated, _ = maximize_scale_evidence(evidence, noise, floor,
                                                            condition=condition)
            del evidence
        start = (factor, calibrated)
        cache = _cache_bytes(ctx.x, ctx.schedule.num_features) if iterative else 0
        if iterative and ctx.options.calibrate:
            result = calibrate_by_products(
                _final_kernel(ctx, centre, outputscale, False), ctx.x, ctx.y, calibrated,
                factor=factor, noise_floor=floor, condition=condition, cache_bytes=cache,
                generator=torch.Generator().manual_seed(ctx.options.seed))
            factor, calibrated = result.factor, result.noise
        kernel = _final_kernel(ctx, centre, outputscale * factor, True)
        noise_data = torch.as_tensor(calibrated, dtype=ctx.x.dtype) * ctx.y_unit**2
        if ctx.options.calibrate:
            report.calibration = {
                "candidates": list(losses), "evidence": losses, "chosen": name,
                "choice_features": choice or features,
                "outputscale_factor": factor, "noise_before": noise * ctx.y_unit**2,
                "noise_after": float(noise_data),
            }
            if iterative:
                report.calibration["iterative"] = {
                    "choice_features": choice, "start_factor": start[0],
                    "start_noise": start[1] * ctx.y_unit**2,
                    "log_evidence": result.log_evidence - shift,
                    "standard_error": result.standard_error,
                    "gradient_standard_error": result.gradient_standard_error,
                    "rank": result.rank, "iterations": result.iterations,
                }
        solve = {"solve": "cg", "cache_bytes": cache} if iterative else {}
        gp = RandomFeatureGP(kernel, noise=noise_data, **solve)
        with torch.no_grad():
            # The final features are the evidence's in the data's units (the input units are
            # powers of two: exact); on the CG path, B - I of the fit is c G of the
            # calibration (the units cancel in a / noise), so its preconditioner serves.
            reuse = (_rescaled_products(kept, kernel, ctx.y_unit) if kept else
                     result.preconditioner if iterative and ctx.options.calibrate else None)
            if ctx.source is not None and kept:
                fit_from_products(gp, ctx, reuse)
            elif ctx.source is not None:
                stream_fit(gp, ctx.source)
            else:
                gp._fit_batches([(ctx.x_data, ctx.y_data, None)], None, reuse=reuse)
    report.lengthscale = centre * ctx.x_unit
    report.lengthscale_draws = None if ctx.draws is None else ctx.draws * centre * ctx.x_unit
    return gp


def _model_evidence(ctx: RecipeContext, kernel: Kernel, products: Optional[list]):
    """:func:`feature_model_evidence` on every row: in memory, or streamed from the source."""
    if ctx.source is not None:
        sums: Optional[list] = [] if products is not None else None
        evidence = source_evidence(kernel, ctx, sums)
        if sums:
            products.append((*sums[0], _outputscale(kernel)))
        return evidence
    return feature_model_evidence(kernel, ctx.x, ctx.y, products)


def _rescaled_products(kept: list, kernel: Kernel, target_unit: float = 1.0) -> tuple:
    """``(Z^T Z, Z^T Y)`` of ``kernel``'s features and the targets times ``target_unit``,
    from ``kept[0] = feature_model_evidence``'s products of the same features at another
    outputscale: the features scale by the square root of the outputscales' ratio (read from
    the kernels, so the outputscale constraint's rounding is followed). The Gram matrix is
    scaled in place."""
    gram, rhs, outputscale = kept[0]
    ratio = _outputscale(kernel) / outputscale
    return gram.mul_(ratio), rhs * (math.sqrt(ratio) * target_unit)


def _outputscale(kernel: Kernel) -> float:
    """The outputscale of ``kernel``'s first ``ScaleKernel`` part (the recipe scales every
    part by one factor)."""
    part = kernel.kernels[0] if isinstance(kernel, AdditiveKernel) else kernel
    return float(part.outputscale.detach())


def _cache_bytes(x: Tensor, width: int) -> int:
    """Bytes of feature rows an iterative fit keeps: all ``N x width`` of them, up to a
    quarter of the memory (the rest are recomputed at every product)."""
    whole = x.shape[0] * width * x.element_size()
    return int(min(whole, available_memory(x.device) // 4))


def calibrated_fit(kernel: Kernel, x: Tensor, y: Tensor, noise: float, *,
                   solve: str = "auto", noise_floor: float = 0.0,
                   seed: int = 0) -> RandomFeatureGP:
    r"""Fit ``kernel``'s feature model with its outputscale and noise chosen by its own
    evidence: the rule of :func:`~rfgp.recipes.fit_auto`'s last stage, for lengthscales found
    elsewhere. With :math:`D` features the factor :math:`a` on the outputscale and the noise
    :math:`\sigma^2` maximise :math:`\log p(y)` of that :math:`D`-feature model; up to 8192
    features (``solve="weight"``) exactly, from one eigendecomposition of its Gram matrix,
    beyond (``solve="cg"``) from products with its features alone (a stochastic estimate whose
    error is far below the evidence's curvature).

    Args:
        kernel: a ``ScaleKernel`` around a random-feature kernel, or a sum of such (e.g.
            :func:`~rfgp.recipes.lengthscale_mixture_kernel`); it is copied, not changed.
        x: ``(N, d)`` inputs; y: ``(N,)`` or ``(N, T)`` centred targets.
        noise: the starting noise (positive).
        solve: ``"auto"`` (the weight space up to 8192 features, CG beyond), ``"weight"`` or
            ``"cg"``.
        noise_floor: the noise's lower bound.
        seed: the seed of the iterative calibration's probes.

    Returns:
        The fitted :class:`~rfgp.RandomFeatureGP` (``solve="cg"`` on the iterative path).

    Example:
        >>> from rfgp.recipes import make_ard_kernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(500, 1, generator=g, dtype=torch.float64)
        >>> y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(500, generator=g, dtype=torch.float64)
        >>> k = make_ard_kernel(256, 1, seed=0)
        >>> k.base_kernel.lengthscale = 0.2
        >>> gp = calibrated_fit(k, x, y - y.mean(), noise=1.0)
        >>> 0.005 < float(gp.noise) < 0.02
        True
    """
    solve = check_choice("solve", solve, ("auto", "weight", "cg"))
    noise = check_positive("noise", noise)
    if not noise_floor >= 0:
        raise ValueError(f"noise_floor must be >= 0, got {noise_floor!r}")
    x, y = check_recipe_data(x, y, "calibrated_fit")
    kernel = copy.deepcopy(kernel)
    parts = kernel.kernels if isinstance(kernel, AdditiveKernel) else [kernel]
    if not all(isinstance(part, ScaleKernel) for part in parts):
        raise TypeError(
            "kernel must be a ScaleKernel around a random-feature kernel, or a sum of such "
            f"(its outputscale is calibrated), got {type(kernel).__name__}"
        )
    width = FeatureMap(feature_kernel(kernel)).num_real_features
    path = final_path(x.shape[0], width, x.shape[1], solve, forced=True)[0]
    condition = _CONDITION[x.dtype]
    products: list = []
    with torch.no_grad():
        if path == "cg":
            cache = _cache_bytes(x, width)
            result = calibrate_by_products(kernel, x, y, noise, noise_floor=noise_floor,
                                           condition=condition, cache_bytes=cache,
                                           generator=torch.Generator().manual_seed(seed))
            factor, noise = result.factor, result.noise
            options = {"solve": "cg", "cache_bytes": cache}
            reuse = result.preconditioner
        else:
            evidence = feature_model_evidence(kernel, x, y, products)
            factor, noise, _ = maximize_scale_evidence(evidence, noise, noise_floor,
                                                       condition=condition)
            options, reuse = {}, None
        for part in parts:
            part.outputscale = part.outputscale * factor
        if products:
            reuse = _rescaled_products(products, kernel)
    gp = RandomFeatureGP(kernel, noise=torch.as_tensor(noise, dtype=x.dtype), **options)
    with torch.no_grad():
        # What the calibration computed serves the fit: the Gram matrix (weight space) or
        # the preconditioner of the fit's B at its root (CG).
        return gp._fit_batches([(x, y, None)], None, reuse=reuse)
