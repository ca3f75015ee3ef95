"""What the scikit-learn estimators share: the named kernels, parameter checks, seeds, the
recipe's options from an estimator's parameters, and target scaling (internal)."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from gpytorch.kernels import Kernel

try:
    from sklearn.base import BaseEstimator
    from sklearn.utils import check_random_state
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rfgp.sklearn needs scikit-learn >= 1.6; install it with "
        "`pip install \"rfgp[sklearn]\"` (or `pip install scikit-learn`)"
    ) from error

from rfgp._parameters import PARAMETER_CONSTRAINTS
from rfgp._validation import validate_parameters
from rfgp.kernels._base import RandomFeatureKernel, unwrap_scale_kernel
from rfgp.recipes import (
    RegressionOptions,
)
from rfgp.recipes._regression import plan_regression

__all__ = [
    "FIT_MAX_FEATURES",
    "InvalidParameterError",
    "KERNELS",
    "RECIPE_KERNELS",
    "REGRESSION_DEFAULTS",
    "as_tensor",
    "check_params",
    "kernel_from",
    "make_kernel",
    "recipe_options",
    "seed_from",
    "store_params",
    "target_scaling",
]


class InvalidParameterError(ValueError, TypeError):
    """A constructor parameter of an estimator is of the wrong type or value.

    It is a ``ValueError`` (what scikit-learn's estimator checks expect of a bad parameter)
    and a ``TypeError`` (what Python code expects of a wrong type), so either can be caught.

    Example:
        >>> from rfgp.sklearn import make_kernel
        >>> try:
        ...     make_kernel("rbf", num_features="many")
        ... except TypeError as error:
        ...     print(error)
        num_features must be a positive integer of at most 2**62, got 'many' (str)
    """


def _fourier(spectral: str) -> Callable[..., RandomFeatureKernel]:
    def build(p: Dict[str, Any], seed: int) -> RandomFeatureKernel:
        from rfgp.kernels import FourierFeatureKernel

        return FourierFeatureKernel(
            p["num_features"], spectral=spectral, sampling=p["sampling"], seed=seed
        )

    return build


def _polynomial(p: Dict[str, Any], seed: int) -> RandomFeatureKernel:
    from rfgp.kernels import PolynomialSketchKernel

    return PolynomialSketchKernel(
        p["degree"], p["num_features"], bias=p["bias"], projection=p["projection"], seed=seed
    )


def _maclaurin(target: str) -> Callable[..., RandomFeatureKernel]:
    def build(p: Dict[str, Any], seed: int) -> RandomFeatureKernel:
        from rfgp.kernels import MaclaurinKernel

        return MaclaurinKernel(
            target, p["num_features"], projection=p["projection"], seed=seed
        )

    return build


def _gaussian_sketch(p: Dict[str, Any], seed: int) -> RandomFeatureKernel:
    from rfgp.kernels import GaussianSketchKernel

    return GaussianSketchKernel(p["num_features"], seed=seed)


#: kernel name -> builder ``(hyperparameters, seed) -> RandomFeatureKernel``.
KERNELS: Dict[str, Callable[[Dict[str, Any], int], RandomFeatureKernel]] = {
    "rbf": _fourier("rbf"),
    "matern12": _fourier("matern12"),
    "matern32": _fourier("matern32"),
    "matern52": _fourier("matern52"),
    "polynomial": _polynomial,
    "exponential": _maclaurin("exponential"),
    "gaussian_maclaurin": _maclaurin("gaussian"),
    "gaussian_sketch": _gaussian_sketch,
}


# The most features a fit outside the recipe gets by default: these fits optimise or evaluate
# at that size, which the recipe's final fit (the only one that goes beyond it) does not.
FIT_MAX_FEATURES = 8192
REGRESSION_DEFAULTS = RegressionOptions()
# Estimator parameters that are recipe options under another name.
_OPTION_NAMES = {"kernel": "spectral", "max_iter": "max_iterations"}

#: kernel names the default recipe (``optimizer="auto"``) fits: the Fourier kernels.
RECIPE_KERNELS = ("rbf", "matern12", "matern32", "matern52")


def check_params(estimator: BaseEstimator) -> Dict[str, Any]:
    """Every constructor parameter of ``estimator`` checked against its entry of
    :data:`rfgp._parameters.PARAMETER_CONSTRAINTS`, whatever the path: a value that a path
    does not use is still refused when it is invalid, not ignored (scikit-learn validates every
    parameter at ``fit``). Returns the values in their canonical types; raises
    :class:`InvalidParameterError` naming the parameter."""
    return validate_parameters(PARAMETER_CONSTRAINTS[type(estimator).__name__],
                               estimator.get_params(deep=False), InvalidParameterError)


def make_kernel(
    name: str,
    num_features: int = 256,
    lengthscale: float = 1.0,
    sampling: str = "iid",
    degree: int = 2,
    bias: float = 1.0,
    projection: str = "rademacher",
    seed: Optional[int] = None,
) -> RandomFeatureKernel:
    r"""Build the random-feature kernel named ``name`` with the given hyperparameters.

    Every kernel is written in terms of :math:`x / \ell` (``lengthscale``), e.g. the RBF kernel
    :math:`\exp(-\|x - y\|^2 / (2\ell^2))` (scikit-learn's ``RBF(length_scale=l)``; for
    ``gamma`` use :math:`\ell = 1/\sqrt{2\gamma}`) and the polynomial kernel
    :math:`(x^\top y / \ell^2 + b)^p`.

    Args:
        name: a key of :data:`KERNELS`.
        num_features: ``D``, the number of feature columns (even for the Fourier kernels).
        lengthscale: initial :math:`\ell > 0`.
        sampling: Fourier kernels: ``"iid"``, ``"orthogonal"`` or ``"structured"``.
        degree: ``p`` of ``"polynomial"``.
        bias: ``b >= 0`` of ``"polynomial"``.
        projection: sketch of ``"polynomial"`` / ``"exponential"`` /
            ``"gaussian_maclaurin"``: ``"rademacher"``, ``"gaussian"``, ``"tensorsketch"`` or
            ``"tensorsrht"``.
        seed: seed of the random weights.

    Returns:
        A float64 :class:`~rfgp.kernels.RandomFeatureKernel`.

    Example:
        >>> k = make_kernel("matern52", num_features=64, lengthscale=0.5, seed=0)
        >>> type(k).__name__, k.features(torch.zeros(3, 2, dtype=torch.float64)).shape
        ('FourierFeatureKernel', torch.Size([3, 64]))
    """
    params = validate_parameters(PARAMETER_CONSTRAINTS["make_kernel"], {
        "name": name, "num_features": num_features, "lengthscale": lengthscale,
        "sampling": sampling, "degree": degree, "bias": bias, "projection": projection,
        "seed": seed}, InvalidParameterError)
    name, lengthscale, seed = params.pop("name"), params.pop("lengthscale"), params.pop("seed")
    kernel = KERNELS[name](params, seed).to(torch.float64)
    if kernel.has_lengthscale:
        kernel.lengthscale = torch.full_like(kernel.lengthscale, lengthscale)
    return kernel


def seed_from(random_state: Any, name: str = "random_state") -> int:
    """The seed of a fit: an integer ``random_state`` is the seed itself, under the recipes'
    one rule (:data:`rfgp._parameters.SEED`: ``[0, 2**64 - 1]``), so that
    ``random_state=s`` fits as the recipe's ``seed=s``; ``None`` or a ``RandomState`` draws
    one. Anything else raises :class:`InvalidParameterError` naming ``name``.

    Example:
        >>> seed_from(2**40)
        1099511627776
    """
    validate_parameters({name: PARAMETER_CONSTRAINTS["RandomFeatureGPRegressor"][
        "random_state"]}, {name: random_state}, InvalidParameterError)
    if random_state is None or isinstance(random_state, np.random.RandomState):
        return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))
    return int(random_state)


def recipe_options(options_type, estimator: BaseEstimator, names, **fixed: Any):
    """The recipe's checked options from the estimator's parameters ``names`` (renamed by
    :data:`_OPTION_NAMES`) and ``fixed`` values; a bad value raises
    :class:`InvalidParameterError` naming the estimator's parameter."""
    values = {_OPTION_NAMES.get(name, name): getattr(estimator, name) for name in names}
    values.update(fixed)
    try:
        return options_type().replace(**values).checked()
    except (TypeError, ValueError) as error:
        message = str(error)
        for param, option in _OPTION_NAMES.items():
            message = message.replace(option, param)
        raise InvalidParameterError(message) from error


def kernel_from(estimator: Any, seed: int, num_rows: int = 1) -> Kernel:
    """The estimator's kernel: built from its name, or a deep copy of the given object.

    A named kernel with ``num_features=None`` gets the default schedule's feature count for
    ``num_rows`` rows, at most 8192.

    A given kernel keeps its own random weights when ``random_state`` is ``None``; otherwise
    its (copy's) weights are redrawn from ``seed`` so that ``random_state`` controls them.
    """
    if isinstance(estimator.kernel, str):
        num_features = estimator.num_features
        if num_features is None:
            num_features = min(FIT_MAX_FEATURES, plan_regression(
                num_rows, estimator.n_features_in_, REGRESSION_DEFAULTS).num_features)
        return make_kernel(
            estimator.kernel, num_features, estimator.lengthscale, estimator.sampling,
            estimator.degree, estimator.bias, estimator.projection, seed,
        )
    kernel = copy.deepcopy(estimator.kernel).to(torch.float64)
    base = unwrap_scale_kernel(kernel)
    if estimator.random_state is not None:
        if base.input_dim is None:
            base.input_dim = estimator.n_features_in_
        if not base.needs_allocation:
            base.resample(torch.Generator().manual_seed(seed))
    return kernel


#: Targets beyond this magnitude are divided by their largest entry internally even without
#: ``normalize_y`` (squares of 1e154 and more overflow float64).
_HUGE_TARGET = 1e100


def target_scaling(y: np.ndarray, normalize: bool):
    """``(offset, scale)`` per column such that ``(y - offset) / scale`` is of order one.

    With ``normalize`` they are the mean and standard deviation (1 where it is 0) of each
    column (a constant column's value, exactly, and 1), computed on ``y / u`` and multiplied
    back by ``u``: ``u = 1`` (exact, so the
    estimator's targets are bit for bit ``(y - y.mean()) / y.std()``, the targets its docstring
    tells :func:`rfgp.fit_auto` to be given) unless ``max|y|`` is beyond :data:`_HUGE_TARGET`
    or below its inverse, where the squares would overflow or underflow and ``u = max|y|``.
    Without it the offset is 0 and the scale 1, unless the targets are so large that their
    squares overflow: then the scale is ``max|y|`` (the posterior mean is linear in ``y``, so
    this changes no prediction).
    """
    with np.errstate(over="ignore"):
        peak = np.max(np.abs(y), axis=0) if y.shape[0] else np.zeros(y.shape[1:])
    peak = np.where(peak > 0, peak, 1.0)
    if normalize:
        unit = np.where((peak < _HUGE_TARGET) & (peak > 1.0 / _HUGE_TARGET), 1.0, peak)
        scaled = y / unit
        std = scaled.std(axis=0)
        mean, scale = scaled.mean(axis=0) * unit, np.where(std > 0, std, 1.0) * unit
        # A constant column's computed mean can differ from its value in the last digit, and
        # its standard deviation is then that rounding: (y - mean) / std would be +-1 in every
        # row, a signal made of rounding. Its offset is its value, exactly, and its scale 1.
        constant = np.all(y == y[:1], axis=0) if y.shape[0] else np.zeros(y.shape[1:], bool)
        return np.where(constant, y[0] if y.shape[0] else 0.0, mean), np.where(
            constant, 1.0, scale)
    scale = np.where(peak > _HUGE_TARGET, peak, 1.0)
    return np.zeros(y.shape[1:]), scale


def as_tensor(array: np.ndarray) -> torch.Tensor:
    # A copy: read-only (memory-mapped) inputs cannot be shared with torch.
    return torch.tensor(np.asarray(array, dtype=np.float64))


def store_params(estimator: BaseEstimator, params: Dict[str, Any]) -> None:
    # scikit-learn's contract: __init__ stores every constructor argument unchanged under its
    # own name (get_params/clone read them back); validation waits for fit.
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)
