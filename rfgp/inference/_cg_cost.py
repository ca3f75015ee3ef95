r"""The cost model of the CG path (``solve="cg"``): the multiply-adds of an iterative fit, of
the Krylov calibration and CG fit of a final model by the features or through the rows'
``N x N`` matrix, what the fit keeps in memory, and the choice of path for a final ``D``
(:func:`final_path`: the ``D x D`` solve, whose costs are in :mod:`~rfgp.inference._fit_cost`,
or CG).

Every count is the leading terms of the fit's products and factorisations, in multiply-adds
(divide by a machine's rate for seconds), memory traffic counted as multiply-adds of the rate
(:data:`PASS_TRAFFIC`).

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from rfgp._data import DEFAULT_CHUNK_ROWS
from rfgp._validation import check_int, check_real
from rfgp.inference._fit_cost import (
    CHOICE_FEATURES,
    DENSE_SPEEDUP,
    MAX_FUNCTION_FEATURES,
    MAX_ITERATIVE_FEATURES,
    MAX_WEIGHT_FEATURES,
    final_fit_cost,
    largest_features_within,
)
from rfgp.inference._linalg import available_memory

__all__ = [
    "CALIBRATION_PROBES",
    "CALIBRATION_RUNS",
    "CG_ITERATIONS",
    "PASS_TRAFFIC",
    "PROBE_RUN_SHARE",
    "SKETCH_PASSES",
    "SKETCH_RANK",
    "cg_fit_cost",
    "cg_fit_seconds",
    "cg_num_features",
    "feature_cache_bytes",
    "final_path",
    "iterative_fit_cost",
    "row_capped_features",
    "rows_fit_cost",
    "rows_route",
]

#: What the cost model expects of the iterative calibration
#: (:mod:`~rfgp.inference._krylov_calibration`): its runs over the target columns in
#: full-length CG solves (a cold run where the recipe starts it and, where the root lies
#: beyond the accepted radius, warm-started ones, shorter), preconditioned CG iterations per
#: solve, probes, the length of a probe's run relative to the targets' (the probes stop at a
#: looser residual), and the Nyström rank (the sketch's automatic rule stops at 512 unless
#: doubling pays over the runs' few solves). The iterations grow with the signal-to-noise
#: ratio: 8 to 9 were measured on 57,247 noisy rows; on pol (13,500 rows, noise 0.007) at
#: 8,192 features the sketch's rule chose rank 1,024, the target runs took 74, 37 and 29
#: iterations (1.9 solves of 74, about twice the model's iterations, whose constants are
#: those of the typical, noisier set) and the probes' runs a sixth of the targets' each.
CALIBRATION_RUNS = 2.0
CG_ITERATIONS = 40
CALIBRATION_PROBES = 8
PROBE_RUN_SHARE = 0.25
SKETCH_RANK = 512
#: Products (passes over the rows) of the sketch's blocks: its rank doubles from 32 to
#: :data:`SKETCH_RANK`.
SKETCH_PASSES = 5
#: Multiply-adds of the rate that a product pass spends per feature entry on memory traffic,
#: beside its ``2 k`` multiply-adds for ``k`` columns. A pass computes :math:`\Phi V`, then
#: :math:`\Phi^H W`, reading every entry twice, and with few columns it runs at the memory's
#: speed, not the multiply-adds': on the reference machine (two cores, float64, 13,500 rows
#: of 30,720 cached features, 3.3 GB) a single-column pass took 0.21 s, 12.6 multiply-adds of
#: the reference rate per entry where 2 were counted (two reads at 32 GB/s), and 3, 5 and 9
#: columns took 19, 23 and 25. Counted apart from the ``2 k`` (traffic and arithmetic that
#: do not overlap), ``2 k + 12`` meets those within a fifth. A calibrated CG fit at that size
#: (pol, 388 passes, most of them single-column) took 143 s where the multiply-adds alone
#: forecast 73 s. The ratio of memory to multiply-add speed is the reference machine's: on
#: one whose memory is slower against its multiply-adds (a GPU's) the
#: term is an estimate that errs low.
PASS_TRAFFIC = 12.0


def feature_cache_bytes(device: torch.device) -> int:
    """Bytes of feature rows an iterative fit keeps across its products: a quarter of
    ``device``'s memory (the rest are recomputed at every pass), the rule the fit, its cost
    model and the variances' forecast share."""
    return available_memory(device) // 4




def cg_fit_cost(num_rows: int, num_features: int, input_dim: int, iterations: int = 100,
                rank: int = 0, num_columns: int = 1, feature_cost: float = 4.0,
                cached: float = False) -> float:
    r"""Multiply-adds of an iterative (``solve="cg"``) fit, a model for choosing ``D``.

    With :math:`N` rows, :math:`D` features, :math:`d` input dimensions, :math:`T` target
    columns, :math:`I` iterations and a Nyström rank :math:`r`, every product
    :math:`B V = \Phi^H(S^{-1}(\Phi V)) + V` with :math:`k` columns costs :math:`2 N D k`
    multiply-adds, plus :math:`N D (d + c)` to recompute the features (projection and
    :math:`c` per entry for the nonlinearity) unless they are cached:

    .. math::
        C = \underbrace{(I + 2) \cdot F}_{\text{features}}
            + \underbrace{2 N D (T (I + 1) + r)}_{\text{products}}
            + \underbrace{t N D (I + 2)}_{\text{traffic}}
            + \underbrace{2 D r^2}_{\text{Nyström}}, \qquad F = N D (d + c)

    (the right-hand side, the sketch and :math:`I` iterations each pass over the data; cached
    features are computed once, :math:`F` instead of :math:`(I + 2) F`; every pass reads
    each feature entry twice, :math:`t` = :data:`PASS_TRAFFIC` multiply-adds of the rate per
    entry, which on few columns outweighs the products). The weight-space
    solve costs :math:`N D^2 + D^3/3` by comparison. Divide by a measured multiply-add rate
    (:func:`cg_fit_seconds`) for seconds.

    Args:
        num_rows: ``N`` (rows times outputs per input for multi-output kernels).
        num_features: ``D`` (real-form columns for complex features: ``2 D``).
        input_dim: ``d``.
        iterations: CG iterations ``I`` (preconditioned fits typically need tens).
        rank: Nyström rank ``r`` (0: no preconditioner).
        num_columns: target columns ``T`` solved together.
        feature_cost: multiply-adds per feature entry beyond the projection (``c``).
        cached: whether the features are cached across products (``cache_bytes``), or the
            share of them that is (the rest recomputed at every pass).

    Returns:
        Multiply-adds (a float).

    Example:
        >>> n, d = 10**5, 2**15  # against the weight-space solve's N D^2 + D^3 / 3
        >>> cg_fit_cost(n, d, 8, iterations=50, rank=256) < (n * d**2 + d**3 / 3) / 10
        True
    """
    rows = check_int("num_rows", num_rows)
    width = check_int("num_features", num_features)
    dim = check_int("input_dim", input_dim)
    iterations = check_int("iterations", iterations, minimum=0)
    rank = check_int("rank", rank, minimum=0)
    columns = check_int("num_columns", num_columns)
    per_entry = check_real("feature_cost", feature_cost, low=0.0)
    features = float(rows) * width * (dim + per_entry)
    share = min(max(float(cached), 0.0), 1.0)
    data_passes = iterations + 2  # the right-hand side, the sketch, the iterations
    computed = share + (1.0 - share) * data_passes  # the features, where not cached
    products = 2.0 * rows * width * (columns * (iterations + 1) + rank)
    traffic = PASS_TRAFFIC * rows * width * data_passes  # each pass reads every entry
    return computed * features + products + traffic + 2.0 * width * rank**2


def cg_fit_seconds(num_rows: int, num_features: int, input_dim: int, *,
                   multiply_adds_per_second: float, **options) -> float:
    r"""Predicted seconds of an iterative fit: :func:`cg_fit_cost` divided by a rate.

    Args:
        num_rows, num_features, input_dim: as in :func:`cg_fit_cost`.
        multiply_adds_per_second: the machine's measured rate (e.g. of a large matrix product).
        **options: ``iterations``, ``rank``, ``num_columns``, ``feature_cost``, ``cached``.

    Returns:
        Seconds.

    Example:
        >>> cg_fit_seconds(1000, 1024, 4, iterations=10, multiply_adds_per_second=1e9) < 1.0
        True
    """
    rate = check_real("multiply_adds_per_second", multiply_adds_per_second, low=0.0,
                      low_inclusive=False)
    return cg_fit_cost(num_rows, num_features, input_dim, **options) / rate


def cg_num_features(num_rows: int, input_dim: int, seconds: float, *,
                    multiply_adds_per_second: float, smallest: int = 1024,
                    largest: int = 1 << 16, **options) -> int:
    r"""The largest power-of-two ``D`` whose iterative fit fits a time budget:
    :func:`largest_features_within` of :func:`cg_fit_seconds`.

    Args:
        num_rows, input_dim: as in :func:`cg_fit_cost`.
        seconds: the time budget of the fit.
        multiply_adds_per_second: the machine's measured rate.
        smallest, largest: the range of ``D`` (``smallest`` when even that exceeds the
            budget).
        **options: ``iterations``, ``rank``, ``num_columns``, ``feature_cost``, ``cached``.

    Returns:
        ``D``.

    Example:
        >>> cg_num_features(10**5, 8, 60.0, multiply_adds_per_second=1e10, iterations=50)
        4096
    """
    budget = check_real("seconds", seconds, low=0.0, low_inclusive=False)
    smallest = check_int("smallest", smallest)
    largest = check_int("largest", largest, minimum=smallest)

    def seconds_of(width: int) -> float:
        return cg_fit_seconds(num_rows, width, input_dim,
                              multiply_adds_per_second=multiply_adds_per_second, **options)

    return largest_features_within(seconds_of, budget, smallest, largest)


def iterative_fit_cost(num_rows: int, num_features: int, input_dim: int,
                       candidates: int = 1, streamed: bool = False,
                       iterations: float = CG_ITERATIONS, rank: int = SKETCH_RANK,
                       cache_bytes: Optional[float] = None) -> float:
    r"""Multiply-adds of the calibrated final fit on the CG path: a weight-space calibration at
    :data:`CHOICE_FEATURES` per candidate (:func:`final_fit_cost`), then the Krylov
    calibration (:mod:`~rfgp.inference._krylov_calibration`) on cached features
    (:math:`N D (d + 4)`): one Nyström sketch of rank :math:`r` (:math:`2 N D r`, and
    :math:`8 D r^2` to factorise it), :math:`R` solves of :math:`I` CG iterations over the
    target and the :math:`p` probe columns, a probe's run :math:`q` times as long
    (:math:`2 N D (1 + q p)` per iteration), and the Galerkin projection onto their
    :math:`s = r + R I (1 + q p)` directions (:math:`2 D s^2`); and the fit,
    :func:`cg_fit_cost` with :math:`I` iterations on cached features and the calibration's
    sketch:

    .. math::
        C = k\,C_{\text{choice}} + N D \big((d + 4) + 2 r + 8 r^2 / N + 2 s^2 / N
            + 2 I R (1 + q p) + t P\big) + C_{\text{CG fit}}(N, D, d, I),

    :math:`t P` the memory traffic of its :math:`P = 2 + 5 + R I (1 + q)` passes
    (:data:`PASS_TRAFFIC` per entry and pass, below).

    ``streamed``: the rows are read from a data source at every product (a memory-map,
    chunks, process shards) and their features recomputed, never cached: the calibration's
    features cost :math:`N D (d + 4)` per pass, one for :math:`\Phi^\top y`, one for the
    trace's probes, :data:`SKETCH_PASSES` for the sketch's blocks and one per CG iteration of
    its runs, the targets' and then the probes' (:math:`2 + 5 + R I (1 + q)` in all), and the
    fit's :math:`I + 2` passes (:func:`cg_fit_cost` uncached).

    In memory the features are cached up to ``cache_bytes`` (default a quarter of the CPU's
    memory, as the fit keeps them): of ``N D`` float64 entries beyond it, the share not held
    is recomputed at every pass as if streamed (on 41,202 rows at 41,202 features, 13.6 GB,
    three fifths of them on a 23 GB machine).

    ``iterations`` (:math:`I`) and ``rank`` (:math:`r`) default to the constants of a typical
    noisy set (:data:`CG_ITERATIONS`, :data:`SKETCH_RANK`); a forecast from the spectrum of a
    smaller model (:func:`~rfgp.inference._cg_forecast.forecast_cg`) passes its own.

    Example:
        >>> iterative_fit_cost(10**5, 2**15, 8) < final_fit_cost(10**5, 2**15, 8) / 3
        True
        >>> iterative_fit_cost(10**5, 2**15, 8, streamed=True) > iterative_fit_cost(10**5, 2**15, 8)
        True
    """
    n, m = float(num_rows), float(num_features)
    choice = final_fit_cost(num_rows, min(num_features, CHOICE_FEATURES), input_dim, candidates)
    columns, subspace, data_passes = _krylov_counts(iterations, rank)
    sketch = 2 * rank + 8 * rank**2 / n + 2 * subspace**2 / n
    share = 0.0 if streamed else _cached_share(n, m, cache_bytes)
    computed = share + (1.0 - share) * data_passes  # the features, where not cached
    # Cached or not, every pass reads its features (PASS_TRAFFIC).
    calibration = n * m * ((input_dim + 4) * computed + sketch + 2 * columns
                           + PASS_TRAFFIC * data_passes)
    fit = cg_fit_cost(num_rows, num_features, input_dim, iterations=math.ceil(iterations),
                      cached=share)
    return choice + calibration + fit


def _krylov_counts(iterations: float, rank: int) -> tuple:
    """``(columns, subspace, passes)`` of the Krylov calibration at ``iterations`` per run and
    sketch ``rank``: the column products of its :data:`CALIBRATION_RUNS` runs over the target
    and the probes (a probe's run :data:`PROBE_RUN_SHARE` as long), the dimension of its
    Galerkin subspace, and its passes over the rows (the projection, the trace's probes, the
    sketch's blocks, its rank doubling from 32, :data:`SKETCH_PASSES` to
    :data:`SKETCH_RANK`, and one per iteration of each run, the targets' and the probes')."""
    columns = iterations * CALIBRATION_RUNS * (1 + CALIBRATION_PROBES * PROBE_RUN_SHARE)
    blocks = max(1, SKETCH_PASSES + round(math.log2(max(rank, 1) / SKETCH_RANK)))
    passes = 2 + blocks + CALIBRATION_RUNS * iterations * (1 + PROBE_RUN_SHARE)
    return columns, rank + columns, passes


def _cached_share(rows: float, features: float, cache_bytes: Optional[float]) -> float:
    """The share of ``rows x features`` float64 features kept within ``cache_bytes`` (default
    :func:`feature_cache_bytes`)."""
    held = feature_cache_bytes(torch.device("cpu")) if cache_bytes is None else cache_bytes
    return min(1.0, held / (8.0 * rows * features))


def rows_route(num_rows: int, num_features: int, streamed: bool = False,
               device: Optional[torch.device] = None, item: int = 8) -> bool:
    r"""Whether a CG fit of ``num_rows`` rows and ``num_features`` features may take the rows'
    ``N x N`` form (:func:`rows_fit_cost`): more features than rows, the rows in memory (not
    ``streamed``), and the ``N x N`` matrix and its factor (numbers of ``item`` bytes) within
    a quarter of the memory (``device``: the CPU by default). The features need not all be
    kept: those beyond :func:`feature_cache_bytes` are computed again where the matrix and the
    variances' products need them. (The features' route forms the rows' matrix for its
    variances only from kept features, :func:`~rfgp.inference._cg_rows.row_form_open`.)

    Example:
        >>> rows_route(3000, 6144), rows_route(3000, 2048), rows_route(3000, 6144, True)
        (True, False, False)
    """
    device = torch.device("cpu") if device is None else device
    n, m = int(num_rows), int(num_features)
    return not streamed and n < m and 2 * n * n * item <= available_memory(device) // 4


def rows_fit_cost(num_rows: int, num_features: int, input_dim: int, candidates: int = 1,
                  iterations: float = CG_ITERATIONS, rank: int = SKETCH_RANK,
                  cache_bytes: Optional[float] = None) -> float:
    r"""Multiply-adds of the calibrated final fit on the CG path through the rows' form
    (:func:`rows_route`): the choice calibrations as in :func:`iterative_fit_cost`; the
    features once, kept (:math:`N D (d + 4)`); :math:`G = \Phi\Phi^\top`
    (:math:`N^2 D / 2`); the Krylov calibration on products with :math:`G`, each
    :math:`N^2` per column and :math:`t / 2` per entry of :math:`G` for its pass's memory
    traffic (a product reads :math:`G` once where a feature pass reads :math:`\Phi` twice,
    :data:`PASS_TRAFFIC` :math:`= t`): the sketch's :math:`r` columns and :math:`8 N r^2`,
    :math:`R` runs of :math:`I` iterations over the target and the probes
    (:math:`1 + q p` columns) in :math:`P = 2 + b + R I (1 + q)` passes, the projection
    :math:`2 N s^2`; then the fit: the Cholesky factor of :math:`I + c G`
    (:math:`N^3 / 3`), the fit's features and one pass for its weights
    (:math:`N D (d + 5)`):

    .. math::
        C = k\,C_{\text{choice}} + N D (2 d + 9)
            + \big(\tfrac12 N^2 D + \tfrac13 N^3\big) / s_{\text{dense}}
            + N^2 \big(r + 8 + R I (1 + q p) + \tfrac{t}{2} P\big) + N (8 r^2 + 2 s^2),

    the dense products at :data:`DENSE_SPEEDUP` (:math:`s_{\text{dense}}`; on pol's 12,150
    rows at 21,504 features :math:`G` took 33.5 s and the Krylov calibration 28.4 s at rank
    1,024 and 139 and 91 iterations, where the CG path's calibration and fit took 99.7 s).
    The factor then serves the first variances, which cost only their query rows
    (:func:`~rfgp.recipes._final_cost.variance_cost`). Features beyond ``cache_bytes`` (default
    :func:`feature_cache_bytes`) are computed again for each block row of :math:`G`, about
    :math:`(C + 1) / 2` times for :math:`C` chunks of rows.

    Example:
        >>> forming_g = 12000**2 * 32768 / 2 / DENSE_SPEEDUP  # most of it, at 32,768 features
        >>> 0.5 < forming_g / rows_fit_cost(12000, 32768, 26) < 1
        True
    """
    n, m = float(num_rows), float(num_features)
    choice = final_fit_cost(num_rows, min(num_features, CHOICE_FEATURES), input_dim, candidates)
    columns, subspace, passes = _krylov_counts(iterations, rank)
    dense = (n * n * m / 2 + n**3 / 3) / DENSE_SPEEDUP
    krylov = (n * n * (rank + 8 + columns + PASS_TRAFFIC / 2 * passes)
              + n * (8 * rank**2 + 2 * subspace**2))
    chunks = math.ceil(n / DEFAULT_CHUNK_ROWS)
    again = (1.0 - _cached_share(n, m, cache_bytes)) * (chunks + 1) / 2 * n * m * (input_dim + 4)
    return choice + n * m * (2 * input_dim + 9) + again + dense + krylov


def row_capped_features(num_rows: int) -> int:
    r"""The rows as a feature count, a member of the schedule's feature grid: ``N``, even (a
    cosine and a sine per frequency), at most :data:`MAX_ITERATIVE_FEATURES`; where the
    ``N x N`` and ``D x D`` solves cost alike. It is no limit: a model of ``D >= N`` features
    spans every function the rows can tell apart, but its prior, :math:`\Phi\Phi^\top`,
    approaches the kernel's only as :math:`D^{-1/2}`, so its posterior keeps moving toward
    the exact GP's beyond the rows (pol, 13,500 rows: test MNLL -0.953 at ``D = N``, -1.006
    at ``2N``), and the CG path, whose products cost :math:`N D`, takes such ``D`` where the
    budget pays for them.

    Example:
        >>> row_capped_features(13501), row_capped_features(10**6)
        (13500, 65536)
    """
    return min(num_rows, MAX_ITERATIVE_FEATURES) // 2 * 2


def final_path(num_rows: int, num_features: int, input_dim: int, solve: str,
               candidates: int = 1, forced: bool = False, streamed: bool = False) -> tuple:
    """``(path, multiply-adds)`` of the calibrated final fit at ``num_features``: ``"weight"``
    (the ``D x D`` solve, or the ``N x N`` one on fewer rows) where its matrices hold at most
    ``MAX_WEIGHT_FEATURES**2`` numbers and ``solve`` is ``"auto"`` or ``"weight"``, else
    ``"cg"`` up to :data:`MAX_ITERATIVE_FEATURES` where ``solve`` is ``"cg"`` or ``"auto"``
    (more features than rows too, where the rows are too many for the ``N x N`` solve: the
    random features' prior approaches the kernel only as ``D`` grows); ``(None, inf)`` where
    neither. A ``forced`` (user-given) ``D`` takes the
    path ``solve`` names whatever its size. ``streamed``: the rows are read from a data source
    at every pass (:func:`iterative_fit_cost`).

    Example:
        >>> final_path(40000, 4096, 9, "auto")[0], final_path(40000, 16384, 9, "auto")[0]
        ('weight', 'cg')
    """
    n, m = num_rows, num_features
    # Past the rows, the N x N solve where its matrices hold: exact up to its own limit.
    function_space = n < m and n * m <= MAX_WEIGHT_FEATURES**2
    fits = m <= MAX_WEIGHT_FEATURES or (function_space and m <= MAX_FUNCTION_FEATURES)
    if (solve == "weight" and (fits or forced)) or (solve == "auto" and fits):
        return "weight", final_fit_cost(n, m, input_dim, candidates)
    # "auto" takes CG (past the rows too) wherever the N x N solve's matrices do not hold.
    if solve == "cg" or (solve == "auto" and (forced or (m <= MAX_ITERATIVE_FEATURES
                                                         and not function_space))):
        return "cg", iterative_fit_cost(n, m, input_dim, candidates, streamed)
    return None, math.inf
