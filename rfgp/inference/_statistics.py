r"""Sufficient statistics of a random-feature GP, accumulated over row chunks and processes.

With real-form features :math:`Z = [\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` (``N x D_r``), targets
:math:`Y` (``N x T``) and a diagonal noise :math:`S`, the posterior of every output depends on the
data only through

.. math::
    G = Z^\top S^{-1} Z, \qquad h = Z^\top S^{-1} y, \qquad c = y^\top S^{-1} y,
    \qquad \textstyle\sum_i \log s_i, \qquad N,

all of which are sums over rows: they can be accumulated chunk by chunk in ``O(D_r^2)`` memory
and summed across processes. The complex statistics follow from the real-form ones:
:math:`\Phi^H S^{-1} \Phi = G_{RR} + G_{JJ} + i (G_{RJ} - G_{RJ}^\top)` and
:math:`\Phi^H S^{-1} y = h_R - i h_J`.

Outputs (columns) whose noise is equal on every row seen so far share one Gram matrix; when a
chunk shows two columns' noise to differ, the shared Gram is copied (exact, since all earlier rows
had equal noise) and the two are accumulated separately from then on. When the groups' noise is
one common value :math:`s_g` except on a few rows (the Dirichlet classifier: class :math:`c`'s
noise differs from the others' only on the rows labelled :math:`c`), a chunk costs one shared
product plus one over each group's differing rows :math:`Z_g`:
:math:`Z^\top S_g^{-1} Z = Z^\top Z / s_g + Z_g^\top (S_g^{-1} - 1/s_g) Z_g`.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from rfgp.inference._checkpoint_record import CheckpointRecord
from rfgp.inference._linalg import check_memory

__all__ = ["FeatureStatistics", "accumulate_gram", "mirror_upper_"]

# Column panel width of the blocked Gram product: wide enough for efficient GEMMs, narrow
# enough that computing only the upper block triangle saves a good part of the work.
_MIN_PANEL = 256
# The shared-Gram path of FeatureStatistics.add is taken when its row products (all rows once,
# plus each group's differing rows) are fewer than this fraction of one product per group.
# 0 disables it.
SHARED_GRAM_GAIN = 0.8


def _panel(width: int) -> int:
    """Column panel width of the blocked Gram product of ``width`` columns."""
    # One formula for accumulate_gram and symmetrize_upper: they must agree on the blocks.
    return max(_MIN_PANEL, -(-width // 4))


def accumulate_gram(
    gram: Tensor, z: Tensor, weight: Optional[Tensor] = None, alpha: float = 1.0
) -> None:
    r"""``gram += alpha z^T diag(weight) z`` on the upper block triangle only (a blocked ``syrk``).

    Only blocks on and above the diagonal are written; :func:`symmetrize_upper` completes the
    matrix. With four column panels this does 5/8 of the multiply-adds of a full ``z^T z``.

    Args:
        gram: ``(D, D)`` accumulator, updated in place.
        z: ``(n, D)`` rows of (real-form) features.
        weight: ``(n,)`` row weights of the right factor (any sign; default all ones).
        alpha: scale of the added product.

    Returns:
        ``None``; ``gram`` holds the sum on and above the block diagonal.

    Example:
        >>> z = torch.randn(50, 300, dtype=torch.float64)
        >>> gram = torch.zeros(300, 300, dtype=torch.float64)
        >>> accumulate_gram(gram, z)
        >>> torch.allclose(symmetrize_upper(gram), z.T @ z)
        True
    """
    width = z.shape[-1]
    panel = _panel(width)
    right = z if weight is None else z * weight.unsqueeze(-1)
    for start in range(0, width, panel):
        stop = min(start + panel, width)
        gram[start:stop, start:].addmm_(
            z[:, start:stop].transpose(0, 1), right[:, start:], alpha=alpha
        )


def _common_value(values: Tensor) -> Tuple[Tensor, Tensor]:
    """The most frequent entry of ``values`` and the mask of the entries that differ from it."""
    uniq, counts = torch.unique(values, return_counts=True)
    mode = uniq[counts.argmax()]
    return mode, values != mode


def symmetrize_upper(gram: Tensor) -> Tensor:
    """The symmetric matrix whose upper block triangle (see :func:`accumulate_gram`) is ``gram``."""
    return mirror_upper_(gram.clone())


def mirror_upper_(gram: Tensor) -> Tensor:
    """:func:`symmetrize_upper` in place: the blocks below the diagonal copied from those above
    (disjoint storage), ``gram`` returned, symmetric to the bit."""
    width = gram.shape[-1]
    panel = _panel(width)
    for start in range(0, width, panel):
        stop = min(start + panel, width)
        gram[stop:, start:stop] = gram[start:stop, stop:].transpose(0, 1)
        # A diagonal block is written in full by addmm, symmetric up to the order of its sums:
        # its strict lower triangle from its upper one.
        block = gram[start:stop, start:stop]
        lower = torch.ones_like(block, dtype=torch.bool).tril(-1)
        block[lower] = block.transpose(0, 1)[lower]
    return gram


class FeatureStatistics:
    """Row sums of the real-form statistics for ``T`` output columns.

    Args:
        num_real_features: ``D_r``, columns of the real-form features.
        num_columns: ``T``.
        weighted: whether rows are weighted by their noise (``S^{-1}``) at accumulation time.
            If ``False`` the statistics are unweighted (``S = I``) and a per-column noise is
            applied when the posterior is formed, so the noise can change without a refit.
        dtype, device: of the statistics. Features, targets and noise added in another dtype
            are cast to it chunk by chunk (float32 features accumulated in float64, say).

    Raises:
        MemoryError: if the ``D_r x D_r`` Gram matrix cannot fit in the device's memory.
    """

    def __init__(
        self,
        num_real_features: int,
        num_columns: int,
        weighted: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_real_features = num_real_features
        self.num_columns = num_columns
        self.weighted = weighted
        self.dtype = dtype
        self.device = torch.device(device)
        check_memory(
            (num_real_features, num_real_features), dtype, self.device,
            "the Gram matrix of the features",
            "use solve='cg' (matrix-free: no D x D matrix), fewer features (num_features), or "
            "with few rows solve='function'",
        )
        zeros = dict(dtype=dtype, device=device)
        self.grams: List[Tensor] = [torch.zeros(num_real_features, num_real_features, **zeros)]
        # differ[i, j]: the noise of columns i and j differed on some row.
        self.differ = torch.zeros(num_columns, num_columns, dtype=torch.bool, device=device)
        # column_groups() of the current differ (None: not computed yet). Computing it costs a
        # device sync and O(T^2) work, and differ changes only in _refine, which resets it.
        self._groups: Optional[List[List[int]]] = None
        self.rhs = torch.zeros(num_real_features, num_columns, **zeros)
        self.yy = torch.zeros(num_columns, **zeros)
        self.log_noise_sum = torch.zeros(num_columns, **zeros)
        self.count = 0

    # ----------------------------------------------------------------- column groups
    def column_groups(self) -> List[List[int]]:
        """Columns grouped by equal noise, ordered by their first column."""
        return [list(cols) for cols in self._column_groups()]

    def _column_groups(self) -> List[List[int]]:
        """:meth:`column_groups`, cached (not to be modified by the caller)."""
        if self._groups is None:
            self._groups = self._group_columns()
        return self._groups

    def _group_columns(self) -> List[List[int]]:
        groups: List[List[int]] = []
        seen = set()
        differ = self.differ.cpu()
        for i in range(self.num_columns):
            if i in seen:
                continue
            members = [j for j in range(i, self.num_columns) if not differ[i, j]]
            seen.update(members)
            groups.append(members)
        return groups

    def _refine(self, differ: Tensor) -> None:
        """Split the Gram groups to match ``differ`` (which must contain ``self.differ``)."""
        old_groups = self._column_groups()
        old_of_column = {c: g for g, cols in enumerate(old_groups) for c in cols}
        self.differ = self.differ | differ
        self._groups = None
        new_groups = self._column_groups()
        used = set()
        grams = []
        for cols in new_groups:
            old = old_of_column[cols[0]]
            grams.append(self.grams[old] if old not in used else self.grams[old].clone())
            used.add(old)
        self.grams = grams

    # ----------------------------------------------------------------- accumulation
    def add(self, z: Tensor, y: Tensor, noise: Optional[Tensor]) -> None:
        """Add rows: real-form features ``z (n, D_r)``, targets ``y (n, T)``, noise ``(n, T)``.

        ``noise`` is required iff the statistics are weighted.
        """
        n = z.shape[0]
        if n == 0:
            return
        z, y = z.to(self.dtype), y.to(self.dtype)
        if noise is not None:
            noise = noise.to(self.dtype)
        if not self.weighted:
            accumulate_gram(self.grams[0], z)
            self.rhs.addmm_(z.transpose(0, 1), y)
            self.yy.add_(y.square().sum(0))
            self.count += n
            return
        if self.num_columns > 1:
            ids = torch.unique(noise.transpose(0, 1), dim=0, return_inverse=True)[1]
            differ = ids.unsqueeze(0) != ids.unsqueeze(1)
            if bool((differ & ~self.differ).any()):
                self._refine(differ)
        inv_noise = noise.reciprocal()
        groups = self._column_groups()
        weights = [inv_noise[:, cols[0]] for cols in groups]
        # When each group's noise is one common value except on a few rows (e.g. the Dirichlet
        # classifier: class c's noise differs from the rest only on the rows labelled c),
        # Z^T W_g Z = w_g Z^T Z + Z_g^T (W_g - w_g) Z_g with Z_g the differing rows: one shared
        # Gram plus one product over each group's own rows, instead of a full product per group.
        common = [_common_value(w) for w in weights] if len(groups) > 1 else []
        differing = sum(int(mask.sum()) for _, mask in common)
        if common and n + differing < SHARED_GRAM_GAIN * len(groups) * n:
            shared = torch.zeros_like(self.grams[0])
            accumulate_gram(shared, z)
            for gram, w, (value, mask) in zip(self.grams, weights, common):
                gram.add_(shared, alpha=float(value))
                if bool(mask.any()):
                    accumulate_gram(gram, z[mask], w[mask] - value)
        else:
            for gram, w in zip(self.grams, weights):
                accumulate_gram(gram, z * w.sqrt().unsqueeze(-1))
        self.rhs.addmm_(z.transpose(0, 1), y * inv_noise)
        self.yy.add_((y.square() * inv_noise).sum(0))
        self.log_noise_sum.add_(noise.log().sum(0))
        self.count += n

    def merge(self, other: FeatureStatistics) -> None:
        """Add the statistics of ``other`` (same layout) into ``self``."""
        if other.weighted != self.weighted or other.num_columns != self.num_columns:
            raise ValueError("cannot merge statistics of different noise modes or output counts")
        self._refine(other.differ)
        other._refine(self.differ)
        for mine, theirs in zip(self.grams, other.grams):
            mine.add_(theirs)
        self.rhs.add_(other.rhs)
        self.yy.add_(other.yy)
        self.log_noise_sum.add_(other.log_noise_sum)
        self.count += other.count

    def all_reduce(self, process_group=None) -> None:
        """Sum the statistics over all processes of ``process_group`` (``torch.distributed``)."""
        import torch.distributed as dist

        differ = self.differ.to(torch.int32)
        dist.all_reduce(differ, op=dist.ReduceOp.SUM, group=process_group)
        self._refine(differ > 0)
        for gram in self.grams:
            dist.all_reduce(gram, op=dist.ReduceOp.SUM, group=process_group)
        for t in (self.rhs, self.yy, self.log_noise_sum):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=process_group)
        count = torch.tensor([float(self.count)], dtype=torch.float64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=process_group)
        self.count = int(round(count.item()))

    def gram(self, group: int) -> Tensor:
        """The full symmetric Gram matrix of column group ``group``."""
        return symmetrize_upper(self.grams[group])

    # ----------------------------------------------------------------- state
    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move (and cast) the statistics in place."""
        self.grams = [g.to(device=device, dtype=dtype) for g in self.grams]
        self.rhs = self.rhs.to(device=device, dtype=dtype)
        self.yy = self.yy.to(device=device, dtype=dtype)
        self.log_noise_sum = self.log_noise_sum.to(device=device, dtype=dtype)
        self.differ = self.differ.to(device=device)
        self.dtype, self.device = dtype, torch.device(device)

    def state(self) -> dict:
        """The statistics as a dict of tensors and plain values (for checkpoints)."""
        return {
            "grams": list(self.grams),
            "differ": self.differ,
            "rhs": self.rhs,
            "yy": self.yy,
            "log_noise_sum": self.log_noise_sum,
            "count": self.count,
            "weighted": self.weighted,
        }

    @classmethod
    def from_state(cls, state: CheckpointRecord) -> FeatureStatistics:
        """The statistics saved by :meth:`state` (a checked record of them)."""
        rhs = state.tensor("rhs", ndim=2)
        stats = cls(rhs.shape[0], rhs.shape[1], state.boolean("weighted"), rhs.dtype,
                    rhs.device)
        grams = state.sequence("grams")
        stats.grams = [grams.tensor(i, ndim=2) for i in range(len(grams))]
        stats.differ = state.tensor("differ", floating=False)
        stats._groups = None
        stats.rhs, stats.yy = rhs, state.tensor("yy", ndim=1)
        stats.log_noise_sum = state.tensor("log_noise_sum", ndim=1)
        stats.count = state.integer("count")
        return stats
