"""What a recipe stage is: a function from typed inputs to a typed output, with a declared cost.

A stage reads the data (:class:`RecipeData`, never changed) and what the stages before handed
on (:class:`Searched`), writes what it did into the report, and returns what it hands on, or
``None`` where it has nothing to do (then it is not timed). Its :class:`Stage` declaration
names it and says what it costs (see :mod:`~rfgp.recipes._schedule`).

Internal: not part of the public API (see :mod:`rfgp.recipes`).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from rfgp._data import centred_source
from rfgp.inference import RandomFeatureGP

__all__ = ["RecipeData", "Searched", "Stage", "StageTimer"]


@dataclass(frozen=True)
class RecipeData:
    """The data every stage reads.

    Attributes:
        options: the checked options.
        schedule: the stages' rows, feature counts and budget.
        x, y: the data in the search's units (inputs over ``x_unit``, targets over
            ``y_unit``).
        x_data, y_data: the data as given (the final fit's).
        x_unit: ``(d,)`` the input units; ``y_unit``: the target unit.
        generator: the recipe's later random draws (the Laplace draws).
        order: a random order of the rows (``None`` where the subsample is every row): the
            subsample is its head, the refinement's rows a longer head.
        source: where the rows are not all held (a memory-map, chunks, a process's shard),
            their :class:`~rfgp._data.DataSource` in the data's units; ``x``, ``y`` (and
            ``x_data``, ``y_data``) then hold the working set, the longest head of the
            random order, in that order.
        target_mean_square: the mean of ``y^2`` over every row in the search's units (from the
            streamed moments; ``None``: that of ``y``).
        target_mean: ``(T,)`` the mean of each target column over every row, search units
            (from the streamed moments; ``None``: that of ``y``).
    """

    options: Any
    schedule: Any
    x: Tensor
    y: Tensor
    x_data: Tensor
    y_data: Tensor
    x_unit: Tensor
    y_unit: float
    generator: torch.Generator
    order: Optional[Tensor] = None
    source: Any = None
    target_mean_square: Optional[float] = None
    target_mean: Optional[Tensor] = None

    @property
    def num_rows(self) -> int:
        """``N``: every row, held or behind the source."""
        return self.source.num_rows if self.source is not None else self.x.shape[0]

    @property
    def num_entries(self) -> int:
        """The target entries of every row, ``N`` times the columns."""
        return self.num_rows * (self.y.numel() // self.y.shape[0])

    def mean_square(self) -> float:
        """The mean of ``y^2`` over every row (search units)."""
        if self.target_mean_square is not None:
            return self.target_mean_square
        return float(self.y.square().mean())

    @property
    def input_dim(self) -> int:
        return self.x.shape[1]

    def centred(self, mean: Tensor) -> RecipeData:
        r"""The data with the targets less ``mean`` (search units; a number or one value per
        target column), everywhere a stage reads them: ``y``, ``y_data`` (less
        ``mean * y_unit``), the source, and the moments (:math:`\overline{(y - m)^2} =
        \overline{y^2} - 2 m \bar y + m^2`, averaged over the columns)."""
        if not bool(mean.any()):
            return self
        mean = mean.to(torch.float64)
        cols = self.y.numel() // max(self.y.shape[0], 1)
        column_mean = mean.reshape(-1).expand(cols)
        means = (self.target_mean if self.target_mean is not None
                 else self.y.to(torch.float64).reshape(self.y.shape[0], cols).mean(0).cpu())
        square = self.mean_square() - float((2.0 * column_mean * means.reshape(-1)
                                             - column_mean.square()).mean())
        data_mean = mean * self.y_unit
        source = None if self.source is None else centred_source(self.source, data_mean)
        return dataclasses.replace(
            self, y=self.y - mean.to(self.y), y_data=self.y_data - data_mean.to(self.y_data),
            source=source, target_mean_square=max(square, 0.0), target_mean=means - column_mean)

    def head(self, count: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """The first ``count`` rows of the random order (all rows, in their order, when
        ``count`` covers them): ``(x, y, rows)``."""
        if count >= self.num_rows:
            return self.x, self.y, None
        if self.source is not None:  # the working set is the order's head, in its order
            rows = torch.arange(count, device=self.x.device)
            return self.x[rows], self.y[rows], rows
        rows = self.order[:count]
        return self.x[rows], self.y[rows], rows


@dataclass(frozen=True)
class Searched:
    """What a search stage hands on: the searched model and how it was searched.

    Attributes:
        model: the model at the hyperparameters found (search features); a stage that
            searches further changes it in place or hands on another.
        rows: the rows of the last search stage (``None``: all).
        evidence: the evidence it maximised (``"exact"``, ``"blocks"`` or ``"features"``).
        blocks: the blocks of neighbouring rows whose exact evidences it summed.
        bound: ``(d,)`` the lengthscale bound in the search's units, where it was kept.
        candidates: named lengthscale vectors, in the search's units, among which the final
            model's evidence chooses (empty: the model's own).
        draws: ``(S, d)`` Laplace draws of the lengthscales relative to the centre, or
            ``None``.
        mean: the constant prior mean the search chose, search units (``None``: zero);
            the stages after it read the data centred by it (:meth:`RecipeData.centred`).
    """

    model: RandomFeatureGP
    rows: Optional[Tensor] = None
    evidence: str = "features"
    blocks: Optional[List[Tensor]] = None
    bound: Optional[Tensor] = None
    candidates: Mapping[str, Tensor] = field(default_factory=dict)
    draws: Optional[Tensor] = None
    mean: Optional[Tensor] = None

    def lengthscale(self) -> Tensor:
        """``(d,)`` the searched model's lengthscales."""
        return self.model.kernel.base_kernel.lengthscale.detach().reshape(-1).clone()

    def data(self, data: RecipeData) -> Tuple[Tensor, Tensor]:
        """The last search stage's rows of ``data``."""
        rows = slice(None) if self.rows is None else self.rows
        return data.x[rows], data.y[rows]


@dataclass(frozen=True)
class Stage:
    """A stage's declaration.

    Attributes:
        name: the stage's module, function, report key (``report.seconds``) and planned
            seconds key (``schedule.predicted``).
        run: ``run(data, searched, report) -> Searched or None`` (the last stage returns the
            fitted model).
        plans: ``((order, plan), ...)``: ``plan(ledger)`` books the stage's setting and cost
            at its ``order`` in the planning (lower first; a stage may book twice, as the
            final fit does: its share first, what the others leave last).
    """

    name: str
    run: Callable[..., Any]
    plans: Tuple[Tuple[int, Callable[[Any], None]], ...] = ()


class StageTimer:
    """Times stages into ``seconds[name]``, on a tqdm bar over the stages where asked."""

    def __init__(self, seconds: Dict[str, float]) -> None:
        self.seconds = seconds
        self._bar: Any = None

    @contextmanager
    def progress(self, total: int, caller: str, show: bool) -> Iterator[None]:
        if not show:
            yield
            return
        from tqdm.auto import tqdm

        with tqdm(total=total, desc=caller, unit="stage") as bar:
            self._bar = bar
            try:
                yield
            finally:
                self._bar = None

    def run(self, stage: Stage, *args: Any) -> Any:
        """``stage.run(*args)``, timed unless it returns ``None`` (nothing to do)."""
        if self._bar is not None:
            self._bar.set_description(stage.name)
        started = time.perf_counter()
        try:
            result = stage.run(*args)
            if result is not None:
                self.seconds[stage.name] = time.perf_counter() - started
            return result
        finally:
            if self._bar is not None:
                self._bar.update(1)
