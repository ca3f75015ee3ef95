r"""The schedule: which stages run, on how many rows and features, within a time budget.

Each stage's cost is predicted in multiply-adds from the rows ``N``, the inputs ``d`` and the
feature counts (the leading terms of its matrix products and factorisations) and converted to
seconds at ``machine_rate``. The final fit takes at most :data:`FINAL_SHARE` of the budget, or
what the first search leaves where that is less: its feature count ``D`` is the largest power
of two whose fit (the Gram matrix, its eigendecomposition for the calibration, the refit) fits
there, because the features' error shrinks only as :math:`D^{-1/2}` while the fit grows as
:math:`N D^2`. The evidence search on the subsample always runs; the refinement's rows, the
local stage's starts and the cross-validated choice of the bound take what the budget leaves,
in that order, and what is left then doubles the final ``D`` while it fits. The default
budget, :func:`default_budget`, grows linearly with ``N``.

The schedule depends on ``N``, ``d``, the options and the budget alone (not on a clock), so a
fit is reproducible; the report compares each stage's predicted seconds with its measured ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict

import torch

from rfgp._validation import check_int
from rfgp.inference._blocks import kd_levels

__all__ = [
    "FINAL_SHARE",
    "MAX_WEIGHT_FEATURES",
    "MIN_FEATURES",
    "Schedule",
    "default_budget",
    "exact_evidence_cost",
    "feature_evidence_cost",
    "final_fit_cost",
    "iterative_fit_cost",
    "measure_machine_rate",
    "plan_regression",
]

#: Share of the time budget the final fit may take before the other stages are planned (it
#: gets what they leave, too).
FINAL_SHARE = 0.4
#: Share of the budget the refinement may take (its rows are reduced to fit).
REFINE_SHARE = 0.2
#: Fewest features of a final fit chosen by the schedule.
MIN_FEATURES = 512
#: Most features of a weight-space (``D x D``) final fit.
MAX_WEIGHT_FEATURES = 8192
#: Most features of a function-space (``N x N``) final fit, on few rows.
MAX_FUNCTION_FEATURES = 32768
#: Most features of an iterative (``solve="cg"``) final fit.
MAX_ITERATIVE_FEATURES = 65536
#: Features of the weight-space calibration that chooses among the candidates and starts the
#: iterative calibration of a larger final model.
CHOICE_FEATURES = 2048
#: What the cost model expects of the iterative calibration: evaluations of its root search,
#: preconditioned CG iterations per solve, probes, and the Nyström rank. The iterations grow
#: with the signal-to-noise ratio: 8 to 9 were measured on 57,247 noisy rows; on 13,500 rows
#: of noise 0.007 at 8,192 features, 59 to 114 at rank 512 and 35 to 67 at the rank 1,024
#: that the sketch's cost rule chose there. The model takes the larger rank and iterations.
CALIBRATION_EVALUATIONS = 8
CG_ITERATIONS = 70
CALIBRATION_PROBES = 8
SKETCH_RANK = 1024
#: Multiply-adds per entry of an exact evidence's ``n x n`` matrices (elementwise passes), and
#: per entry and input (distances, gradient sums): fitted to evaluations with their gradients
#: on 400 to 1,000 rows of 4 to 32 inputs, where counting the Cholesky factor and the
#: distances alone fell short by 2 to 5 times.
EXACT_ELEMENTWISE_COST = 100.0
EXACT_DISTANCE_COST = 8.0
#: L-BFGS evaluations the cost model expects of a search run to convergence, and per
#: iteration of a capped one (a line search mostly accepts its first step).
SEARCH_EVALUATIONS = 60
EVALUATIONS_PER_ITERATION = 1.25
#: L-BFGS iterations of each start of the local stage.
LOCAL_ITERATIONS = 40
#: Adam steps of the first search's warm-up path (rfgp.recipes._search.WARM_UP_STEPS).
WARM_UP_STEPS = 100


def default_budget(num_rows: int) -> float:
    r"""The default time budget in seconds, :math:`\max(30, 20 + N / 400)`: linear in the
    rows (about two minutes at :math:`4 \cdot 10^4` rows), so that the search's rows and the
    final feature count grow with the data, and at least the half minute that the
    cross-validated model choice takes on a couple of thousand rows.

    On many rows the search stages read at most ``refine_rows`` rows (their cost stops
    growing) and the final fit costs :math:`a + bN`; from about :math:`10^6` rows the default
    budget holds the final ``D`` at :data:`MAX_WEIGHT_FEATURES`, about 1.9 ms per row at the
    reference rate with 10 inputs. A smaller budget buys fewer features, down to
    :data:`MIN_FEATURES` (about 7 µs per row with 10 inputs); below that the fit warns and
    takes what its final fit needs.

    Example:
        >>> default_budget(1000), default_budget(40000)
        (30.0, 120.0)
    """
    num_rows = check_int("num_rows", num_rows)
    return max(30.0, 20.0 + num_rows / 400.0)


def feature_evidence_cost(num_rows: int, num_features: int, input_dim: int) -> float:
    r"""Multiply-adds of one evaluation of the random-feature evidence and its gradient:
    :math:`2 n D^2 + 2 n D d + D^3` (the Gram matrix and its derivative products, the
    projections, the factor)."""
    n, m = float(num_rows), float(num_features)
    return 2 * n * m * m + 2 * n * m * input_dim + m**3


def exact_evidence_cost(num_rows: int, input_dim: int, block_rows: int = 0) -> float:
    r"""Multiply-adds of one evaluation of the exact evidence and its gradient on ``num_rows``
    rows, :math:`n^3 + c_2 n^2 + c_d n^2 d`, or summed over the blocks that
    :func:`~rfgp.inference.kd_blocks` cuts for ``block_rows`` (``N / 2^k`` rows each).

    The cubic term is the Cholesky factor and the inverse the gradient needs
    (:math:`n^3 / 3 + 2 n^3 / 3`); :math:`c_d n^2 d` (:data:`EXACT_DISTANCE_COST`) the
    distances and the lengthscales' gradient sums; :math:`c_2 n^2`
    (:data:`EXACT_ELEMENTWISE_COST`) the elementwise passes over the ``n x n`` matrices,
    which run at memory speed, not at a product's.

    Args:
        num_rows: ``n`` (at least 1); input_dim: ``d`` (at least 0).
        block_rows: the most rows of a block (0: one block of every row).

    Raises:
        TypeError / ValueError: for a non-integer or out-of-range argument.

    Example:
        >>> exact_evidence_cost(3000, 4, 1000) == 4 * exact_evidence_cost(750, 4)
        True
    """
    num_rows = check_int("num_rows", num_rows)
    input_dim = check_int("input_dim", input_dim, minimum=0)
    block_rows = check_int("block_rows", block_rows, minimum=0)
    if block_rows and num_rows > block_rows:
        blocks = 2 ** kd_levels(num_rows, block_rows)
        return blocks * exact_evidence_cost(math.ceil(num_rows / blocks), input_dim)
    n = float(num_rows)
    return n**3 + (EXACT_ELEMENTWISE_COST + EXACT_DISTANCE_COST * input_dim) * n * n


def final_fit_cost(num_rows: int, num_features: int, input_dim: int,
                   candidates: int = 1) -> float:
    r"""Multiply-adds of the final fit with its calibration. In weight space, one calibration
    costs the features (:math:`N D d`), the Gram matrix (:math:`\frac58 N D^2` as a blocked
    product of its upper triangle) and its eigendecomposition (about :math:`4 D^3`); there is
    one per candidate lengthscale at :math:`\min(D, D_c)` features
    (:data:`CHOICE_FEATURES`), one more at :math:`D` where several candidates were compared
    at fewer, and the Cholesky factor (the fit reuses the chosen Gram matrix). In function
    space (``N < D``), the features, the kernel matrix :math:`N^2 D` and its
    eigendecomposition per candidate, and the fit's features, kernel matrix and factor.

    Example:
        >>> final_fit_cost(10**4, 2048, 8, 2) > final_fit_cost(10**4, 2048, 8)
        True
    """
    n, m, k = float(num_rows), float(num_features), max(1, candidates)
    if n < m:
        features = n * m * input_dim
        return (k + 1) * (features + n * n * m) + 4 * k * n**3 + n**3 / 3

    def calibration(width: float) -> float:
        return n * width * input_dim + 0.625 * n * width * width + 4 * width**3

    if k > 1 and m > CHOICE_FEATURES:
        return k * calibration(CHOICE_FEATURES) + calibration(m) + m**3 / 3
    return k * calibration(m) + m**3 / 3


def iterative_fit_cost(num_rows: int, num_features: int, input_dim: int,
                       candidates: int = 1) -> float:
    r"""Multiply-adds of the iterative final fit with its calibration: a weight-space
    calibration at :data:`CHOICE_FEATURES` per candidate (:func:`final_fit_cost`), then, on
    cached features (:math:`N D (d + 4)` each for the calibration and the fit), one Nyström
    sketch of rank :math:`r` (:math:`2 N D r`, and :math:`8 D r^2` to factorise it), which
    the fit reuses at the root, :math:`E` evaluations of :math:`I` CG iterations over the
    target and :math:`p` probe columns (:math:`2 N D (1 + p)` each) and the fit's :math:`I`
    iterations:

    .. math::
        C = k\,C_{\text{choice}} + N D \big(2 (d + 4) + 2 r + 8 r^2 / N
            + 2 I (E (1 + p) + 1)\big).

    Example:
        >>> iterative_fit_cost(10**5, 2**15, 8) < final_fit_cost(10**5, 2**15, 8) / 3
        True
    """
    n, m = float(num_rows), float(num_features)
    choice = final_fit_cost(num_rows, min(num_features, CHOICE_FEATURES), input_dim, candidates)
    per_column = 2 * CG_ITERATIONS * (CALIBRATION_EVALUATIONS * (1 + CALIBRATION_PROBES) + 1)
    sketch = 2 * SKETCH_RANK + 8 * SKETCH_RANK**2 / n
    return choice + n * m * (2 * (input_dim + 4) + sketch + per_column)


def final_path(num_rows: int, num_features: int, input_dim: int, solve: str,
               candidates: int = 1, forced: bool = False) -> tuple:
    """``(path, multiply-adds)`` of the final fit at ``num_features``: ``"weight"`` (the
    ``D x D`` solve, or the ``N x N`` one on fewer rows) where its matrices hold at most
    ``MAX_WEIGHT_FEATURES**2`` numbers and ``solve`` is ``"auto"`` or ``"weight"``, else
    ``"cg"`` up to :data:`MAX_ITERATIVE_FEATURES` where ``solve`` is ``"cg"``, or ``"auto"``
    and ``D <= N``;
    ``(None, inf)`` where neither. A ``forced`` (user-given) ``D`` takes the path ``solve``
    names whatever its size.

    Example:
        >>> final_path(40000, 4096, 9, "auto")[0], final_path(40000, 16384, 9, "auto")[0]
        ('weight', 'cg')
    """
    n, m = num_rows, num_features
    fits = m <= MAX_WEIGHT_FEATURES or (
        n < m and m <= MAX_FUNCTION_FEATURES and n * m <= MAX_WEIGHT_FEATURES**2)
    if (solve == "weight" and (fits or forced)) or (solve == "auto" and fits):
        return "weight", final_fit_cost(n, m, input_dim, candidates)
    # "auto" solves by CG only where D <= N: on fewer rows the N x N path is exact for any D.
    if solve == "cg" or (solve == "auto" and (forced or m <= min(n, MAX_ITERATIVE_FEATURES))):
        return "cg", iterative_fit_cost(n, m, input_dim, candidates)
    return None, math.inf


@dataclass
class Schedule:
    """What the recipe will run: which stages, on how many rows and features (the budget's
    rule is in :mod:`rfgp.recipes`).

    Attributes:
        budget: seconds available.
        machine_rate: multiply-adds per second of the cost model.
        subsample: rows of the first search stage.
        search_features: ``D`` of the search stages.
        search_evidence: ``"exact"``, ``"blocks"`` or ``"features"``: the evidence the first
            stage maximises.
        refine_rows: rows of the refinement (0: none).
        local_starts: starts of the local stage (0: none).
        choose_bound: whether the cross-validated choice of the bound may run.
        num_features: ``D`` of the final fit.
        predicted: predicted seconds per stage.
        final_solve: ``"weight"`` or ``"cg"``, the final fit's path (:func:`final_path`).
    """

    budget: float
    machine_rate: float
    subsample: int
    search_features: int
    search_evidence: str
    refine_rows: int
    local_starts: int
    choose_bound: bool
    num_features: int
    predicted: Dict[str, float] = field(default_factory=dict)
    final_solve: str = "weight"


def refinement_rows(num_rows: int, subsample: int, options, evaluation_cost,
                    total: float) -> tuple:
    """``(rows, multiply-adds)`` of the refinement: up to ``refine_rows`` rows, halved (never
    below the subsample) until its ``refine_iterations`` evaluations of
    ``evaluation_cost(rows)`` fit :data:`REFINE_SHARE` of the ``total`` budget; ``(0, 0)``
    where there is none."""
    if num_rows <= subsample or not options.refine_iterations:
        return 0, 0.0
    evaluations = options.refine_iterations * EVALUATIONS_PER_ITERATION
    rows = min(num_rows, options.refine_rows)
    while rows > subsample and evaluations * evaluation_cost(rows) > REFINE_SHARE * total:
        rows = max(subsample, rows // 2)
    return rows, evaluations * evaluation_cost(rows)


def _search_evidence(num_rows: int, subsample: int, search_features: int, input_dim: int,
                     exact_rows: int) -> tuple:
    """``(evidence, multiply-adds of one evaluation)`` of the first search: the exact
    evidence on a subsample of at most ``exact_rows`` rows, the blocks' where the subsample
    is every row, else the features'."""
    if subsample <= exact_rows:
        return "exact", exact_evidence_cost(subsample, input_dim)
    if subsample == num_rows and exact_rows >= 2:
        return "blocks", exact_evidence_cost(subsample, input_dim, exact_rows)
    return "features", feature_evidence_cost(subsample, search_features, input_dim)


def _final_features(num_rows: int, input_dim: int, budget: float, minimum: int,
                    solve: str, candidates: int = 1) -> int:
    """The largest power of two ``D >= minimum`` whose final fit (:func:`final_path`, with
    ``candidates`` lengthscales to choose among) costs at most ``budget`` multiply-adds."""
    best, size = minimum, minimum
    while size <= MAX_ITERATIVE_FEATURES:
        if final_path(num_rows, size, input_dim, solve, candidates)[1] <= budget:
            best = size
        size *= 2
    return best


def plan_regression(num_rows: int, input_dim: int, options) -> Schedule:
    """The schedule of :func:`~rfgp.recipes.fit_auto` for ``num_rows`` rows of ``input_dim``
    inputs under checked :class:`~rfgp.recipes.RegressionOptions`.

    Example:
        >>> from rfgp.recipes._options import RegressionOptions
        >>> s = plan_regression(40000, 9, RegressionOptions().checked())
        >>> s.num_features, s.subsample, s.search_evidence, s.refine_rows > 0
        (4096, 2000, 'features', True)
        >>> plan_regression(300, 4, RegressionOptions().checked()).search_evidence
        'exact'
    """
    n, d, opts = num_rows, input_dim, options
    budget = opts.time_budget if opts.time_budget is not None else default_budget(n)
    rate = opts.machine_rate
    total = budget * rate
    # The final fit first: its share decides D, for the candidates it may have to choose
    # among (the refinement's end and, where a local stage can run, its best).
    subsample = min(n, opts.subsample)
    local_possible = (n > subsample and opts.refine_iterations > 0 and opts.local_search
                      and opts.exact_rows >= 2)
    # The search's features: never more than the final fit's, which the schedule chooses at
    # least as many as the search's unless the user fixed them.
    search_features = min(opts.search_features, opts.num_features or opts.search_features)
    # The first search always runs, along two paths, one after an Adam warm-up
    # (two_path_search); where it holds every row, the Laplace Hessian is of its evidence.
    evidence, search = _search_evidence(n, subsample, search_features, d, opts.exact_rows)
    first = (2 * SEARCH_EVALUATIONS + WARM_UP_STEPS) * search
    if opts.num_features is not None:
        features = opts.num_features
    else:
        # The final share, or what the first search leaves where that is less (an exact
        # search on a couple of thousand rows can take most of a small budget).
        leaves = total - first - ((d + 3) * search if opts.lengthscale_draws else 0.0)
        features = _final_features(n, d, min(FINAL_SHARE * total, leaves),
                                   max(MIN_FEATURES, opts.search_features), opts.solve,
                                   2 if local_possible else 1)
    predicted = {"search": first / rate}
    forced = opts.num_features is not None
    spent = first + final_path(n, features, d, opts.solve, forced=forced)[1]
    # The refinement: as many rows as its share allows, never fewer than the subsample.
    refine_rows, refine = refinement_rows(
        n, subsample, opts, lambda rows: feature_evidence_cost(rows, search_features, d), total)
    if refine_rows:
        predicted["refine"] = refine / rate
        spent += refine
    # The local stage: its starts (the refinement's end, then one per shortened
    # lengthscale) as the remaining budget allows.
    # The Laplace Hessian: d + 3 gradients of the last search stage's evidence.
    if refine_rows:
        last = feature_evidence_cost(refine_rows, search_features, d)
    else:
        last = search
    hessian = (d + 3) * last if opts.lengthscale_draws else 0.0
    local_starts = 0
    if refine_rows and opts.local_search and opts.exact_rows >= 2:
        blocks = exact_evidence_cost(refine_rows, d, opts.exact_rows)
        per_start = LOCAL_ITERATIONS * EVALUATIONS_PER_ITERATION * blocks
        # After a local stage the Hessian is that of its block evidence, and the final
        # model's evidence chooses between two candidates (a second Gram matrix).
        block_hessian = (d + 3) * blocks if opts.lengthscale_draws else 0.0
        second = (final_path(n, features, d, opts.solve, 2, forced)[1]
                  - final_path(n, features, d, opts.solve, 1, forced)[1])
        local_starts = int(max(0.0, total - spent - block_hessian - second) // per_start)
        local_starts = min(local_starts, d + 1)
        if local_starts:
            predicted["local"] = local_starts * per_start / rate
            spent += local_starts * per_start + second
            hessian = block_hessian
    if hessian:
        predicted["laplace"] = hessian / rate
        spent += hessian
    # What the stages leave goes to the final fit's features.
    candidates = 2 if local_starts else 1
    while opts.num_features is None and features < MAX_ITERATIVE_FEATURES:
        extra = (final_path(n, 2 * features, d, opts.solve, candidates)[1]
                 - final_path(n, features, d, opts.solve, candidates)[1])
        if spent + extra > total:
            break
        features, spent = 2 * features, spent + extra
    # The bound's cross-validated choice: where the search holds every row, two searches
    # per fold on the other rows.
    choose_bound = False
    if subsample == n and opts.max_lengthscale is not None:
        folds = max(opts.cv_folds, 1)
        rows = n - n // folds if opts.cv_folds else n
        if evidence == "features":
            per_search = feature_evidence_cost(rows, search_features, d)
        else:
            per_search = exact_evidence_cost(rows, d, opts.exact_rows)
        # Per fold an unbounded and a bounded search at a ten times looser tolerance (about
        # half the evaluations each); then the bounded search on every row.
        per_fold = SEARCH_EVALUATIONS
        choice = per_search * (opts.cv_folds * per_fold + SEARCH_EVALUATIONS)
        choose_bound = spent + choice <= total
        if choose_bound:
            predicted["select"] = choice / rate
            spent += choice
    path, cost = final_path(n, features, d, opts.solve, candidates, forced)
    predicted["refit"] = cost / rate
    return Schedule(budget, rate, subsample, search_features, evidence, refine_rows, local_starts,
                    choose_bound, features, predicted, path)


def measure_machine_rate(size: int = 1024, repeats: int = 3,
                         dtype: torch.dtype = torch.float64) -> float:
    """This machine's multiply-adds per second in a ``size x size`` matrix product (the best
    of ``repeats``): pass it as ``machine_rate`` to budget in this machine's seconds.

    Example:
        >>> measure_machine_rate(64, 1) > 0
        True
    """
    size = check_int("size", size, minimum=2)
    repeats = check_int("repeats", repeats)
    a = torch.randn(size, size, dtype=dtype)
    best = math.inf
    for _ in range(repeats + 1):  # the first product warms the library up
        started = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - started)
    return size**3 / max(best, 1e-9)
