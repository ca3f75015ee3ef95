"""The context every stage of a recipe reads and writes: the data in the search's units, the
options, the schedule, the model being searched, what the stages found, and the report.

Internal: not part of the public API (see :mod:`rfgp.recipes`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp._data import draw_rows
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.recipes._report import FitReport
from rfgp.recipes._schedule import Schedule

__all__ = ["RecipeContext"]


@dataclass
class RecipeContext:
    """The state passed from stage to stage.

    Attributes:
        options: the checked options.
        schedule: the stages' rows, feature counts and budget.
        report: filled in as the stages run.
        x, y: the data in the search's units (inputs over ``x_unit``, targets over
            ``y_unit``).
        x_data, y_data: the data as given (the final fit's).
        x_unit: ``(d,)`` the input units; ``y_unit``: the target unit.
        generator: every random draw of the recipe (subsample, folds, Laplace draws).
        order: a random order of the rows: the subsample is its head, the refinement's rows
            a longer head.
        model: the model the search stages change (search features).
        bound: ``(d,)`` the lengthscale bound in the search's units, where it was kept.
        rows: the rows of the last search stage (``None``: all).
        blocks: the blocks of neighbouring rows whose exact evidences the last stage summed.
        evidence: the evidence the last stage maximised.
        candidates: named lengthscale vectors, in the search's units, among which the final
            model's evidence chooses.
        draws: ``(S, d)`` Laplace draws of the lengthscales, relative to the centre
            (``draws / centre``), or ``None``.
        extra: stage-specific values (the classifier's targets and noise).
        source: where the rows are not all held (a memory-map, chunks, a process's shard),
            their :class:`~rfgp._data.DataSource` in the data's units; ``x``, ``y`` (and
            ``x_data``, ``y_data``) then hold the working set, the longest head of the
            random order, in that order.
        target_mean_square: with a ``source``, the mean of ``y^2`` over every row in the
            search's units.
    """

    options: Any
    schedule: Schedule
    report: FitReport
    x: Tensor
    y: Tensor
    x_data: Tensor
    y_data: Tensor
    x_unit: Tensor
    y_unit: float
    generator: torch.Generator
    order: Optional[Tensor] = None
    model: Optional[RandomFeatureGP] = None
    bound: Optional[Tensor] = None
    rows: Optional[Tensor] = None
    blocks: Optional[List[Tensor]] = None
    evidence: str = "features"
    candidates: Dict[str, Tensor] = field(default_factory=dict)
    draws: Optional[Tensor] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    source: Any = None
    target_mean_square: Optional[float] = None
    _bar: Any = None

    @property
    def num_rows(self) -> int:
        return self.source.num_rows if self.source is not None else self.x.shape[0]

    def mean_square(self) -> float:
        """The mean of ``y^2`` over every row (search units)."""
        if self.target_mean_square is not None:
            return self.target_mean_square
        return float(self.y.square().mean())

    @property
    def input_dim(self) -> int:
        return self.x.shape[1]

    def head(self, count: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """The first ``count`` rows of the random order (all rows, in their order, when
        ``count`` covers them): ``(x, y, rows)``."""
        if count >= self.num_rows:
            return self.x, self.y, None
        if self.source is not None:  # the working set is the order's head, in its order
            rows = torch.arange(count, device=self.x.device)
            return self.x[rows], self.y[rows], rows
        if self.order is None:
            # One draw for the longest head: a shorter head is its prefix.
            longest = max(count, self.schedule.subsample, self.schedule.refine_rows)
            self.order = draw_rows(self.num_rows, longest, self.generator).to(self.x.device)
        rows = self.order[:count]
        return self.x[rows], self.y[rows], rows

    def stage_data(self) -> Tuple[Tensor, Tensor]:
        """The last search stage's rows."""
        if self.rows is None:
            return self.x, self.y
        return self.x[self.rows], self.y[self.rows]

    def lengthscale(self) -> Tensor:
        """``(d,)`` the searched model's lengthscales."""
        return self.model.kernel.base_kernel.lengthscale.detach().reshape(-1).clone()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage into ``report.seconds[name]`` and show it on the progress bar."""
        if self._bar is not None:
            self._bar.set_description(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.report.seconds[name] = time.perf_counter() - started
            if self._bar is not None:
                self._bar.update(1)

    @contextmanager
    def progress(self, stages: int, caller: str) -> Iterator[None]:
        """A tqdm bar over ``stages`` stages when the options ask for one."""
        if not self.options.progress:
            yield
            return
        from tqdm.auto import tqdm

        with tqdm(total=stages, desc=caller, unit="stage") as bar:
            self._bar = bar
            try:
                yield
            finally:
                self._bar = None
