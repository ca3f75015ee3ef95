r"""The state of one fit: the solver, the noise layout and what the fit depends on.

:class:`FitState` is what ``RandomFeatureGP`` holds after ``fit``: the
:class:`~rfgp.inference._solvers.Solver`, the :class:`~rfgp.inference._noise.NoiseLayout`, the
kernel's :class:`~rfgp.inference._fingerprint.Fingerprint`, the model noise the factorisation
used, the dtype and device of the features, and (after ``fit``, not ``fit_stream``) references
to the training batches, so that a changed kernel can be refitted. It moves with ``.to()`` and
round-trips through a ``state_dict`` without the training data.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import Tensor

from rfgp._ops import power_of_two_scale
from rfgp.inference._cg_solver import ConjugateGradientSolver
from rfgp.inference._checkpoint_record import CheckpointRecord
from rfgp.inference._fingerprint import Fingerprint
from rfgp.inference._noise import NoiseLayout, check_noise_usable
from rfgp.inference._solvers import FunctionSpaceSolver, Solver, WeightSpaceSolver

__all__ = ["Batch", "FitState", "StaleFitError", "power_of_two_scale"]

#: ``(x, y, noise)`` as the user passed them to ``fit`` or ``update``
Batch = Tuple[Any, Any, Any]

_SOLVER_TYPES = {
    cls.name: cls for cls in (WeightSpaceSolver, FunctionSpaceSolver, ConjugateGradientSolver)
}


class StaleFitError(RuntimeError):
    """The kernel or noise changed since the fit and the model cannot refit by itself."""


def _move_value(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    return fn(value) if isinstance(value, Tensor) else value


@dataclass
class FitState:
    """Everything a fitted ``RandomFeatureGP`` holds (see the module docstring)."""

    solver: Solver
    layout: NoiseLayout
    fingerprint: Fingerprint
    factor_noise: Tensor
    feature_dtype: torch.dtype
    device: torch.device
    held: Optional[List[Batch]] = None
    chunk: Optional[int] = None
    #: whether the fit chose the kernel's data-dependent allocation from its own rows (then
    #: more rows call for a new allocation, as a fit on all of them would choose)
    allocated_by_fit: bool = False
    #: the constant prior mean the fit subtracted from the targets (``None``: zero)
    prior_mean: Optional[Tensor] = None

    def changes(self, kernel: torch.nn.Module, model_noise: Tensor,
                prior_mean: Optional[Tensor] = None) -> List[str]:
        """What changed since the fit that a refactorisation cannot follow (empty: nothing)."""
        check_noise_usable(model_noise, self.solver.dtype)
        changes = self.fingerprint.changes(kernel)
        if not _same_mean(self.prior_mean, prior_mean):
            changes.append("the prior mean changed since fit")
        if self.layout.frozen_noise_changed(model_noise):
            changes.append("the model noise changed since fit (its per-output values were "
                           "folded into the statistics)")
        return changes

    def must_reallocate(self, kernel_name: str, distributed: bool) -> bool:
        """Whether an ``update`` must allocate the kernel again on all rows and refit (the fit
        chose the allocation from its rows); a ``ValueError`` if it cannot (data not held, or a
        distributed update)."""
        if self.allocated_by_fit and (self.held is None or distributed):
            raise ValueError(
                f"update: the fit chose {kernel_name}'s data-dependent allocation from its rows "
                "and a fit on all rows would choose another, but the training data is not held "
                "(or the update is distributed); call fit on all the rows, or "
                "kernel.allocate(x_sample) before fitting"
            )
        return self.allocated_by_fit

    def follow_model_noise(self, model_noise: Tensor, column_noise: Optional[Tensor]) -> None:
        """Refactorise if the model noise, applied at factorisation, changed."""
        if self.layout.uses_model_noise and not torch.equal(self.factor_noise, model_noise):
            self.solver.factorise(column_noise)
            self.factor_noise = model_noise.detach().clone()

    def move(self, fn, device: torch.device, dtype: torch.dtype, stats_dtype: torch.dtype) -> None:
        """Follow ``Module._apply(fn)``: features in ``dtype`` on ``device``."""
        self.solver.to(device, stats_dtype)
        self.fingerprint.apply(fn)
        self.factor_noise = fn(self.factor_noise)
        if self.prior_mean is not None:
            self.prior_mean = fn(self.prior_mean)
        if self.layout.frozen is not None:
            self.layout.frozen = fn(self.layout.frozen)
        if self.held is not None:
            self.held = [tuple(_move_value(v, fn) for v in batch) for batch in self.held]
        self.feature_dtype, self.device = dtype, device

    def to_dict(self) -> dict:
        """Tensors and plain values only (``torch.load(weights_only=True)`` reads them)."""
        return {
            "fitted": True,
            "solver": self.solver.state(),
            "target_scale": self.solver.target_scale,
            "layout": self.layout.state(),
            "fingerprint": dict(self.fingerprint.tensors),
            "factor_noise": self.factor_noise,
            "feature_dtype": str(self.feature_dtype).replace("torch.", ""),
            "device": str(self.device),
            "allocated_by_fit": self.allocated_by_fit,
            "prior_mean": self.prior_mean,
        }

    @classmethod
    def from_dict(cls, state: Any, complex_solve: bool, jitter) -> Optional[FitState]:
        """The fit saved by :meth:`to_dict`; a missing or malformed entry is refused, named
        (:class:`~rfgp.inference._checkpoint_record.CheckpointRecord`)."""
        record = CheckpointRecord(state, "'_extra_state'")
        if not record.boolean("fitted"):
            return None
        solver_record = record.record("solver")
        kind = solver_record.choice("solver", _SOLVER_TYPES)
        solver = _SOLVER_TYPES[kind].from_state(
            solver_record, complex_solve, jitter, record.positive("target_scale")
        )
        layout = record.record("layout")
        fingerprint = record.record("fingerprint")
        num_columns = layout.integer("num_columns", 1)
        outputs = layout.integer("outputs_per_input", 1)
        if isinstance(solver, ConjugateGradientSolver):
            for index, (x, targets, _) in enumerate(solver.operator.data):
                if x.shape[0] * outputs != targets.shape[0]:
                    raise ValueError(
                        f"checkpoint entry {solver_record.path}['data'][{index}] must hold "
                        f"{outputs} target rows per input row, got {x.shape[0]} inputs and "
                        f"{targets.shape[0]} target rows"
                    )
        covered = sorted(c for cols in solver.groups() for c in cols)
        if covered != list(range(num_columns)):
            raise ValueError(
                f"checkpoint entry {solver_record.path}: its factors (or noise groups) must "
                f"cover the {num_columns} output columns once each, got columns {covered}"
            )
        return cls(
            solver=solver,
            layout=NoiseLayout(
                num_columns=num_columns,
                y_ndim=layout.integer("y_ndim", 1),
                outputs_per_input=outputs,
                fixed=layout.boolean("fixed"),
                frozen=layout.tensor("frozen", optional=True),
            ),
            fingerprint=Fingerprint({name: fingerprint.tensor(name, floating=False)
                                     for name in fingerprint.values}),
            factor_noise=record.tensor("factor_noise"),
            feature_dtype=record.dtype("feature_dtype"),
            device=record.device("device"),
            allocated_by_fit=record.boolean("allocated_by_fit", False),
            # absent from checkpoints of models without a prior mean: zero
            prior_mean=(record.tensor("prior_mean", optional=True)
                        if "prior_mean" in record.values else None),
        )


def _same_mean(fitted: Optional[Tensor], now: Optional[Tensor]) -> bool:
    """Whether two prior means (``None``: zero) are equal."""
    fitted = torch.zeros(()) if fitted is None else fitted
    now = torch.zeros(()) if now is None else now
    if fitted.shape != now.shape and fitted.dim() and now.dim():
        return False
    return bool((fitted.to(torch.float64).cpu() == now.to(torch.float64).cpu()).all())
