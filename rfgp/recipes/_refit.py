r"""The final fit: the hyperparameters belong to the model that predicts.

The final kernel has the schedule's ``D`` features (the Laplace average of the lengthscales
where there are draws, :func:`~rfgp.recipes.lengthscale_mixture_kernel`), on the
data as given. **Rule:** its outputscale and noise maximise the evidence of that
``D``-feature model itself (:func:`~rfgp.inference.calibrate_scales`: one eigendecomposition
of its Gram matrix, then :math:`O(D)` per evaluation), and where the search stages left more
than one candidate lengthscale vector (the refinement's end, the local stage's best) the evidence of
the same model with at most :data:`~rfgp.inference.CHOICE_FEATURES` features (each
calibrated) chooses among them. The fit then reuses the chosen model's Gram matrix. The
search's hyperparameters belong to cheaper models (a
subsample, :math:`D_s` features, or the exact kernel on blocks): a variation that ``D``
features cannot follow is noise to the final model, and only its own evidence says how much.
The lengthscales themselves are not moved at ``D``: each evaluation of that evidence's
gradient costs :math:`2 N D^2`, more than the whole calibration, and a few such steps buy less
than the same time spent on more features or on the local stage.

Where the schedule's final path is ``"cg"`` (``D`` beyond the ``D x D`` path), the candidates
are chosen, and the scales started, by the evidence of a
:data:`~rfgp.inference.CHOICE_FEATURES`-feature model; the ``D``-feature model's own
scales then come from products with its features alone, and it is fitted by conjugate
gradients (:func:`~rfgp.inference.fit_calibrated`). This stage keeps only the choice among the
candidates: the calibration and the fit are :mod:`rfgp.inference`'s.
"""

from __future__ import annotations

import math
from typing import Dict

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp.inference import (
    CHOICE_FEATURES,
    RandomFeatureGP,
    ScaleCalibration,
    calibrate_scales,
    fit_calibrated,
)
from rfgp.recipes._laplace import lengthscale_mixture_kernel
from rfgp.recipes._stage import RecipeContext
from rfgp.recipes._start import make_ard_kernel, set_hyperparameters
from rfgp.recipes._units import NOISE_FLOOR

__all__ = ["refit_stage"]


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
    path = ctx.schedule.final_solve
    iterative = path == "cg"
    with ctx.stage("refit"):
        # The evidence is computed in the search's units: power-of-two units scale every
        # result exactly, and the final kernel is then built in the data's.
        outputscale = ctx.model.kernel.outputscale.detach()
        noise = float(ctx.model.noise.detach())
        # Without calibration the searched model is kept as it is.
        candidates: Dict[str, Tensor] = (dict(ctx.candidates) if ctx.options.calibrate
                                         else {}) or {"search": ctx.lengthscale()}
        best = ("search", ctx.lengthscale(), ScaleCalibration(path, 1.0, noise))
        losses = {}
        shift = math.log(ctx.y_unit)  # a log density per datum in the data's units
        floor = NOISE_FLOOR * float(ctx.y.square().mean())
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
            # Only the final D-feature model's Gram matrix serves the fit.
            calibration = calibrate_scales(_final_kernel(ctx, centre, outputscale, False, choice),
                                           ctx.x, ctx.y, noise, noise_floor=floor,
                                           keep=not (iterative or choice))
            losses[name] = calibration.loss / ctx.y.numel() + shift
            if len(losses) == 1 or losses[name] < losses[best[0]]:
                best = (name, centre, calibration)
            del calibration
        name, centre, calibration = best
        start = calibration
        if choice and ctx.options.calibrate:
            # The chosen lengthscales' D-feature model calibrates itself: in weight space from
            # the search's scales as every candidate did (the fewer features' outputscale
            # factor can be far from its own), by CG from the fewer features' scales.
            calibration = calibrate_scales(
                _final_kernel(ctx, centre, outputscale, False), ctx.x, ctx.y,
                start.noise if iterative else noise, path=path,
                factor=start.factor if iterative else 1.0, noise_floor=floor,
                seed=ctx.options.seed)
        kernel = _final_kernel(ctx, centre, outputscale * calibration.factor, True)
        if ctx.options.calibrate:
            report.calibration = {
                "candidates": list(losses), "evidence": losses, "chosen": name,
                "choice_features": choice or features,
                "outputscale_factor": calibration.factor,
                "noise_before": noise * ctx.y_unit**2,
                "noise_after": float(torch.as_tensor(calibration.noise, dtype=ctx.x.dtype)
                                     * ctx.y_unit**2),
            }
            if iterative:
                result = calibration.iterative
                report.calibration["iterative"] = {
                    "choice_features": choice, "start_factor": start.factor,
                    "start_noise": start.noise * ctx.y_unit**2,
                    "log_evidence": result.log_evidence - shift,
                    "standard_error": result.standard_error,
                    "gradient_standard_error": result.gradient_standard_error,
                    "rank": result.rank, "iterations": result.iterations,
                }
        # The final features are the evidence's in the data's units (the input units are
        # powers of two: exact); on the CG path, B - I of the fit is c G of the calibration
        # (the units cancel in a / noise), so its preconditioner serves.
        gp = fit_calibrated(kernel, ctx.x_data, ctx.y_data, calibration, ctx.y_unit)
    report.lengthscale = centre * ctx.x_unit
    report.lengthscale_draws = None if ctx.draws is None else ctx.draws * centre * ctx.x_unit
    return gp
