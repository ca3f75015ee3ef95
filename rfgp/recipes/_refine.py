r"""Refinement: the search continued on more rows, then the exact evidence on blocks of
neighbouring rows from further starts.

**Refinement.** A subsample's evidence maximum is biased (long lengthscales, large noise):
``refine_iterations`` more L-BFGS iterations on the schedule's ``refine_rows`` rows (a superset
of the subsample) at the search's feature count correct it, at :math:`O(n D_s^2)` per
evaluation.

**Local stage.** The :math:`D_s`-feature evidence cannot follow a short lengthscale: a fine
variation along one input must be called noise, so its landscape hides maxima out there. The
refinement's rows are cut into blocks of at most ``exact_rows`` neighbouring rows
(k-d blocks), and the sum of the blocks' exact evidences is
maximised from the refinement's end and from starts that each shorten one lengthscale to a
tenth, the most relevant inputs (shortest lengthscale per unit of spread) first, as many
starts as the schedule affords. The highest block evidence is kept as a *candidate*: the
final model's own evidence decides between it and the refinement's end
(:mod:`~rfgp.recipes._refit`), since a lengthscale the exact kernel can follow may be one the
final ``D`` features cannot.
"""

from __future__ import annotations

import math

from rfgp.inference._blocks import kd_blocks
from rfgp.recipes._schedule import LOCAL_ITERATIONS
from rfgp.recipes._search import SearchResult, maximize_evidence
from rfgp.recipes._stage import RecipeContext
from rfgp.recipes._start import search_model
from rfgp.recipes._units import column_scale

__all__ = ["LOCAL_SHORT_START", "local_stage", "record_search", "refine_stage"]

#: The local stage's extra starts: the refinement's end with one lengthscale at this share.
LOCAL_SHORT_START = 0.1


def record_search(ctx: RecipeContext, name: str, result: SearchResult, evidence: str) -> None:
    """Record a search stage's losses, iterations and convergence in the report."""
    report = ctx.report
    report.losses[name], report.iterations[name] = result.losses, result.iterations
    report.converged[name], report.evidence[name] = result.converged, evidence


def refine_stage(ctx: RecipeContext) -> None:
    """The refinement (module docstring), where the schedule has one."""
    rows = ctx.schedule.refine_rows
    if not rows:
        return
    opts = ctx.options
    with ctx.stage("refine"):
        xs, ys, ctx.rows = ctx.head(rows)
        ctx.blocks, ctx.evidence = None, "features"
        result = maximize_evidence(ctx.model, xs, ys, opts.refine_iterations, opts.tolerance)
        record_search(ctx, "refine", result, "features")
    ctx.candidates = {"search": ctx.lengthscale()}


def local_stage(ctx: RecipeContext) -> None:
    """The local stage (module docstring), with the schedule's number of starts."""
    starts = ctx.schedule.local_starts
    if not starts:
        return
    opts = ctx.options
    with ctx.stage("local"):
        xs, ys = ctx.stage_data()
        blocks = kd_blocks(xs, opts.exact_rows)
        centre = ctx.lengthscale()
        start = {"outputscale": ctx.model.kernel.outputscale.detach(),
                 "noise": ctx.model.noise.detach()}
        relevance = (centre / column_scale(xs)).argsort().tolist()
        candidates = [centre]
        for j in relevance[:starts - 1]:
            shorter = centre.clone()
            shorter[j] = shorter[j] * LOCAL_SHORT_START
            candidates.append(shorter)
        best, best_loss, iterations = None, math.inf, 0
        for lengthscale in candidates:
            model = search_model(ctx.schedule.search_features,
                                 {**start, "lengthscale": lengthscale}, opts.spectral,
                                 opts.seed, xs)
            result = maximize_evidence(model, xs, ys, LOCAL_ITERATIONS, opts.tolerance,
                                       exact=True, blocks=blocks)
            iterations += result.iterations
            # L-BFGS restores the best point it evaluated: its loss is the smallest.
            loss = min(result.losses) if result.losses else math.inf
            ctx.report.local_losses.append(loss)
            if loss < best_loss:
                best, best_loss = model, loss
                ctx.report.converged["local"] = result.converged
                ctx.report.losses["local"] = result.losses
        ctx.report.iterations["local"] = iterations
        ctx.report.local_blocks = len(blocks)
        ctx.report.evidence["local"] = "blocks"
        if best is None:  # no start could be evaluated: keep the refinement's end
            return
        ctx.model, ctx.blocks, ctx.evidence = best, blocks, "blocks"
        ctx.candidates["local"] = ctx.lengthscale()
