"""Choosing ``alpha_epsilon`` (and a lengthscale) of the Dirichlet GP classifier on a validation
split, by fitting fresh candidate models."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from rfgp._softmax import PROBA_METHODS
from rfgp._validation import check_choice, check_positive, check_real
from rfgp.classification._inputs import base_kernel, check_inputs, encode_labels
from rfgp.kernels._base import RandomFeatureKernel

__all__ = ["ALPHA_GRID", "select_alpha"]

#: The papers' grid for ``alpha_epsilon``: ``10^-5, 10^-4, ..., 10^0``.
ALPHA_GRID: Tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)

# What select_alpha uses of its template (a DirichletGPClassifier). Checked by name, and typed
# as Any, because the classifier module imports this one; imports run one way only.
_TEMPLATE_ATTRIBUTES = ("kernel", "num_classes", "centre", "outputscale", "num_samples", "seed",
                        "solver_kwargs", "fit", "predict_proba")


def _candidate(template: Any, alpha: float, lengthscale: Optional[float],
               num_classes: int) -> Any:
    """A fresh, unfitted classifier like ``template`` with its own copy of the kernel."""
    kernel = copy.deepcopy(template.kernel)
    if lengthscale is not None:
        base = base_kernel(kernel)
        base.lengthscale = torch.full_like(base.lengthscale, lengthscale)
    return type(template)(
        kernel, alpha_epsilon=alpha, num_classes=num_classes, centre=template.centre,
        outputscale=template.outputscale, num_samples=template.num_samples, seed=template.seed,
        **template.solver_kwargs,
    )


def _check_training_part(train: Tensor, labels: Tensor, classes: Tensor,
                         validation_fraction: float, seed: int) -> None:
    """Refuse a split whose training part holds fewer than two classes (the user's labels held
    two or more, so the error is the split's, and the message says how to change it)."""
    present = torch.unique(train)
    if present.numel() >= 2:
        return
    counts = torch.bincount(labels, minlength=classes.numel()).tolist()
    raise ValueError(
        f"the training part of the validation split (validation_fraction="
        f"{validation_fraction}, seed={seed}) holds {train.numel()} of {labels.numel()} rows, "
        f"all of class {classes[present[0]].item()}; fitting needs at least two classes "
        f"(the labels' class counts are {dict(zip(classes.tolist(), counts))}): lower "
        "validation_fraction, change seed or pass more rows"
    )


def select_alpha(
    classifier: Any,
    x: Any,
    labels: Any,
    alphas: Sequence[float] = ALPHA_GRID,
    lengthscales: Optional[Sequence[float]] = None,
    validation_fraction: float = 0.1,
    seed: int = 0,
    lengthscale_criterion: str = "validation",
    method: str = "mean_field",
) -> Tuple[Any, List[Dict[str, Any]]]:
    """Fit a fresh classifier per candidate on a training part and return the best.

    The data are split at random (``seed``) into a training part and a validation part of
    ``validation_fraction``; every ``(alpha, lengthscale)`` candidate is a new classifier with
    ``classifier``'s settings and a deep copy of its kernel, fitted on the training part and
    scored by the validation MNLL of its probabilities (``method``, deterministic by default).
    The candidate with the *smallest* MNLL wins (ties: the first in grid order). With
    ``lengthscale_criterion="marginal_likelihood"`` the lengthscale is instead chosen per alpha
    by the log marginal likelihood on the training part, and only alpha by the validation MNLL.
    ``classifier`` itself is never changed. A random-feature kernel that has not drawn its
    weights yet draws them first, so that every candidate uses the same features.

    Args:
        classifier: the template, a :class:`DirichletGPClassifier` (kernel and settings).
        x, labels: the data, as for :meth:`DirichletGPClassifier.fit`.
        alphas: candidate ``alpha_epsilon`` values (default :data:`ALPHA_GRID`).
        lengthscales: candidate lengthscales of the (base) kernel; ``None`` keeps it.
        validation_fraction: share of the data held out, in ``(0, 1)``.
        seed: seed of the split.
        lengthscale_criterion: ``"validation"`` or ``"marginal_likelihood"``.
        method: probability method for the validation MNLL.

    Returns:
        ``(best, rows)``: the winning candidate, fitted on the training part, and one dict per
        candidate with ``alpha_epsilon``, ``lengthscale``, ``mnll``,
        ``log_marginal_likelihood`` (NaN unless used) and ``selected``.

    Example:
        >>> import gpytorch
        >>> from rfgp.classification import DirichletGPClassifier
        >>> x = torch.cat([torch.zeros(10, 1), torch.ones(10, 1)]).double()
        >>> y = torch.cat([torch.zeros(10), torch.ones(10)]).long()
        >>> clf = DirichletGPClassifier(gpytorch.kernels.RBFKernel().double())
        >>> best, rows = select_alpha(clf, x, y, alphas=(0.01, 0.1), validation_fraction=0.2)
        >>> len(rows), sum(r["selected"] for r in rows)
        (2, 1)
    """
    from rfgp.datasets import train_test_split
    from rfgp.metrics import mnll_classification

    if not all(hasattr(classifier, name) for name in _TEMPLATE_ATTRIBUTES):
        raise TypeError(
            f"classifier must be a DirichletGPClassifier, got {type(classifier).__name__}"
        )
    x = check_inputs(x)
    indices, classes = encode_labels(labels, classifier.num_classes)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(
            f"labels must have one entry per row of x ({x.shape[0]}), got {indices.shape[0]}"
        )
    validation_fraction = check_real("validation_fraction", validation_fraction, low=0.0,
                                     high=1.0, low_inclusive=False, high_inclusive=False)
    check_choice("lengthscale_criterion", lengthscale_criterion,
                 ("validation", "marginal_likelihood"))
    check_choice("method", method, PROBA_METHODS)
    alphas = [check_positive("alphas", a) for a in alphas]
    if not alphas:
        raise ValueError("alphas must hold at least one value")
    base = base_kernel(classifier.kernel)
    if lengthscales is not None:
        lengthscales = [check_positive("lengthscales", v) for v in lengthscales]
        if not lengthscales:
            raise ValueError("lengthscales must hold at least one value")
        if not base.has_lengthscale:
            raise ValueError(
                f"lengthscales given but the kernel {type(base).__name__} has no lengthscale"
            )
    if (isinstance(base, RandomFeatureKernel) and not base.weights_initialized
            and not base.needs_allocation):
        with torch.no_grad():
            base.features(x[:1])  # draws the weights once, so the copies share them
    x_train, labels_train, x_val, labels_val = train_test_split(
        x, indices, validation_fraction, torch.Generator().manual_seed(seed)
    )
    num_classes = classes.numel()
    _check_training_part(labels_train, indices, classes, validation_fraction, seed)
    rows: List[Dict[str, Any]] = []
    # Only the best candidate so far is kept alive: each holds its own factorisations.
    best: Optional[Tuple[float, int, Any]] = None
    for alpha in alphas:
        group: Optional[Tuple[float, int, Any]] = None
        for ls in lengthscales if lengthscales is not None else [None]:
            model = _candidate(classifier, alpha, ls, num_classes).fit(x_train, labels_train)
            lml = (model.log_marginal_likelihood()
                   if lengthscale_criterion == "marginal_likelihood" else float("nan"))
            proba = model.predict_proba(x_val, method=method)
            score = float(mnll_classification(proba, labels_val))
            rows.append({"alpha_epsilon": alpha, "lengthscale": ls, "mnll": score,
                         "log_marginal_likelihood": lml, "selected": False})
            entry = (score if math.isfinite(score) else math.inf, len(rows) - 1, model)
            if lengthscale_criterion == "marginal_likelihood" and lengthscales is not None:
                # Per alpha, the lengthscale of the largest evidence (the first on ties).
                if group is None or lml > rows[group[1]]["log_marginal_likelihood"]:
                    group = entry
                continue
            if best is None or entry[0] < best[0]:
                best = entry
        if group is not None and (best is None or group[0] < best[0]):
            best = group
    rows[best[1]]["selected"] = True
    # The candidates were fitted on class indices: the winner predicts the user's class ids.
    best[2].classes_ = classes.to(best[2].classes_.device)
    return best[2], rows
