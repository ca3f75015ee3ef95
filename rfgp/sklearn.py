r"""scikit-learn estimators on top of :class:`rfgp.RandomFeatureGP` and
:class:`rfgp.DirichletGPClassifier` (the ``sklearn`` extra: ``pip install "rfgp[sklearn]"``).

Both estimators take numpy arrays (or anything :func:`sklearn.utils.validation.validate_data`
accepts), return numpy arrays, compute in float64, and work in ``Pipeline``, ``GridSearchCV``
and ``clone``. The kernel is either named by a string, built from the estimator's
hyperparameters (``num_features``, ``sampling``, ``lengthscale``, ...), or given as an rfgp
kernel, which is deep-copied at ``fit`` (the object passed in is never changed).

Kernel names (:data:`KERNELS`):

========================  =================================================================
``"rbf"``                 :class:`~rfgp.kernels.FourierFeatureKernel` (``spectral="rbf"``),
                          :math:`\exp(-\|x - y\|^2 / 2\ell^2)`
``"matern12"``, ...32/52  :class:`~rfgp.kernels.FourierFeatureKernel`, Matérn
                          :math:`\nu = 1/2, 3/2, 5/2`
``"polynomial"``          :class:`~rfgp.kernels.PolynomialSketchKernel`,
                          :math:`(x^\top y / \ell^2 + b)^p`
``"exponential"``         :class:`~rfgp.kernels.MaclaurinKernel` (``target="exponential"``),
                          :math:`\exp(x^\top y / \ell^2)`
``"gaussian_maclaurin"``  :class:`~rfgp.kernels.MaclaurinKernel` (``target="gaussian"``)
``"gaussian_sketch"``     :class:`~rfgp.kernels.GaussianSketchKernel` (Phillips & Tai)
========================  =================================================================
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rfgp.sklearn needs scikit-learn >= 1.6; install it with "
        "`pip install \"rfgp[sklearn]\"` (or `pip install scikit-learn`)"
    ) from error

from gpytorch.kernels import Kernel, ScaleKernel
from linear_operator.utils.warnings import NumericalWarning

from rfgp._validation import check_int
from rfgp.classification import PROBA_METHODS, DirichletGPClassifier, softmax_expectation
from rfgp.inference.feature_gp import ConvergenceWarning, RandomFeatureGP
from rfgp.kernels.base import RandomFeatureKernel, unwrap_scale_kernel
from rfgp.recipes import (
    ClassifierFitReport,
    ClassifierOptions,
    FitReport,
    RegressionOptions,
    fit_auto,
    fit_classifier_auto,
)
from rfgp.recipes.classification import plan_classifier
from rfgp.recipes.schedule import plan_regression

__all__ = [
    "InvalidParameterError",
    "KERNELS",
    "make_kernel",
    "RandomFeatureGPRegressor",
    "RandomFeatureGPClassifier",
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
        num_features must be a positive integer, got 'many' (str)
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
_FIT_MAX_FEATURES = 8192
_REGRESSION_DEFAULTS = RegressionOptions()
# Estimator parameters that are recipe options under another name.
_OPTION_NAMES = {"kernel": "spectral", "max_iter": "max_iterations"}

#: kernel names the default recipe (``optimizer="auto"``) fits: the Fourier kernels.
_RECIPE_KERNELS = ("rbf", "matern12", "matern32", "matern52")


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(
            f"{name} must be a positive float, got {value!r} ({type(value).__name__})"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidParameterError(f"{name} must be a positive float, got {value!r}")
    return float(value)


def _check_positive_int(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InvalidParameterError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise InvalidParameterError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


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
    if not isinstance(name, str) or name not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)} or an rfgp kernel, got {name!r}")
    num_features = _check_positive_int("num_features", num_features)
    lengthscale = _check_positive("lengthscale", lengthscale)
    params = {"num_features": num_features, "sampling": sampling, "degree": degree,
              "bias": float(bias), "projection": projection}
    kernel = KERNELS[name](params, seed).to(torch.float64)
    if kernel.has_lengthscale:
        kernel.lengthscale = torch.full_like(kernel.lengthscale, lengthscale)
    return kernel


def _seed(random_state: Any) -> int:
    """The seed of a fit: a non-negative integer ``random_state`` is the seed itself (so that
    ``random_state=s`` fits as the recipe's ``seed=s``); ``None`` or a ``RandomState`` draws
    one."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool) and (
            0 <= random_state < 2**63):
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _recipe_options(options_type, estimator: BaseEstimator, names, **fixed: Any):
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


def _kernel_from(estimator: Any, seed: int, num_rows: int = 1) -> Kernel:
    """The estimator's kernel: built from its name, or a deep copy of the given object.

    A named kernel with ``num_features=None`` gets the default schedule's feature count for
    ``num_rows`` rows, at most 8192.

    A given kernel keeps its own random weights when ``random_state`` is ``None``; otherwise
    its (copy's) weights are redrawn from ``seed`` so that ``random_state`` controls them.
    """
    if isinstance(estimator.kernel, str):
        num_features = estimator.num_features
        if num_features is None:
            num_features = min(_FIT_MAX_FEATURES, plan_regression(
                num_rows, estimator.n_features_in_, _REGRESSION_DEFAULTS).num_features)
        return make_kernel(
            estimator.kernel, num_features, estimator.lengthscale, estimator.sampling,
            estimator.degree, estimator.bias, estimator.projection, seed,
        )
    if not isinstance(estimator.kernel, Kernel):
        raise TypeError(
            f"kernel must be a string in {sorted(KERNELS)} or an rfgp kernel, got "
            f"{type(estimator.kernel).__name__}"
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


def _target_scaling(y: np.ndarray, normalize: bool):
    """``(offset, scale)`` per column such that ``(y - offset) / scale`` is of order one.

    With ``normalize`` they are the mean and standard deviation (1 where it is 0), computed on
    ``y / max|y|`` so that targets of size 1e160 do not overflow. Without it the offset is 0
    and the scale 1, unless the targets are so large that their squares overflow: then the
    scale is ``max|y|`` (the posterior mean is linear in ``y``, so this changes no prediction).
    """
    with np.errstate(over="ignore"):
        peak = np.max(np.abs(y), axis=0) if y.shape[0] else np.zeros(y.shape[1:])
    peak = np.where(peak > 0, peak, 1.0)
    if normalize:
        unit = y / peak
        mean = unit.mean(axis=0)
        std = unit.std(axis=0)
        return mean * peak, np.where(std > 0, std, 1.0) * peak
    scale = np.where(peak > _HUGE_TARGET, peak, 1.0)
    return np.zeros(y.shape[1:]), scale


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    # A copy: read-only (memory-mapped) inputs cannot be shared with torch.
    return torch.tensor(np.asarray(array, dtype=np.float64))


def _store_params(estimator: BaseEstimator, params: Dict[str, Any]) -> None:
    # scikit-learn's contract: __init__ stores every constructor argument unchanged under its
    # own name (get_params/clone read them back); validation waits for fit.
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


class RandomFeatureGPRegressor(RegressorMixin, BaseEstimator):
    r"""Random-feature GP regression as a scikit-learn estimator.

    The model is :math:`y = m + s\,f(x) + \varepsilon` with
    :math:`f \sim GP(0, \sigma_f^2 \hat k)`, :math:`\hat k(x, x') = \Phi(x)^\top
    \overline{\Phi(x')}` a random-feature kernel with ``D`` features, and
    :math:`\varepsilon \sim N(0, s^2 \sigma^2)`, where ``m``, ``s`` standardise the targets
    (``normalize_y``). Fitting costs :math:`O(N D^2 + D^3)` (:class:`rfgp.RandomFeatureGP`).

    By default (``optimizer="auto"`` with a Fourier kernel: ``"rbf"`` or a Matérn) the fit is
    rfgp's regression recipe, :func:`rfgp.fit_auto`, on the standardised targets with the
    same options (:class:`rfgp.recipes.RegressionOptions`: ``max_iter`` is its
    ``max_iterations``, ``kernel`` its ``spectral``, ``random_state=s`` its ``seed=s``), so the
    estimator and ``fit_auto(X, (y - y.mean()) / y.std(), seed=s)`` make the same model:
    the evidence is maximised cheaply, and the final ``D``-feature model chooses its own
    outputscale and noise by its evidence, all within ``time_budget`` seconds;
    ``lengthscale``, ``sampling`` and ``noise`` are then not used. With
    ``optimizer="lbfgs"`` (and ``"auto"`` with the other kernels) the lengthscale, the
    outputscale :math:`\sigma_f^2` and the noise :math:`\sigma^2` of the kernel built from
    the arguments maximise the log marginal likelihood (the random weights stay fixed).

    Args:
        kernel: a name in :data:`KERNELS` (wrapped in a ``ScaleKernel``) or an rfgp kernel
            (a :class:`~rfgp.kernels.RandomFeatureKernel` or a ``ScaleKernel`` around one),
            deep-copied at ``fit``.
        num_features: ``D`` of a named kernel; ``None`` chooses it from the number of rows
            and the time budget (:func:`rfgp.recipes.schedule.plan_regression`; at most 8192
            outside the recipe).
        lengthscale: initial lengthscale of a named kernel (not used by ``"auto"``).
        sampling: frequency sampling of the Fourier kernels (``"iid"``, ``"orthogonal"``,
            ``"structured"``; ``"auto"`` uses orthogonal frequencies).
        degree: degree ``p`` of ``"polynomial"``.
        bias: bias ``b`` of ``"polynomial"``.
        projection: sketch of the dot-product kernels.
        noise: (initial) noise variance :math:`\sigma^2`, in units of the standardised targets
            (not used by ``"auto"``).
        optimizer: ``"auto"`` (the recipe), ``"lbfgs"``, ``"adam"`` or ``None`` (keep the
            hyperparameters).
        max_iter: optimiser iterations (``"auto"``: L-BFGS iterations of the evidence search;
            ``"lbfgs"``: outer iterations of up to 20 evaluations).
        normalize_y: standardise the targets (mean and standard deviation per column);
            otherwise only the zero prior mean is used.
        random_state: seed (a non-negative int is the seed itself; a ``RandomState`` or
            ``None`` draws one) of the random features. A given kernel keeps its own weights
            when ``None``.
        time_budget: ``"auto"`` only: the recipe's time budget in seconds (``None``: its
            default, linear in the rows).
        max_lengthscale: ``"auto"`` only: the recipe's candidate bound on the lengthscales, in
            standard deviations of each input (``None``: the unbounded evidence maximum,
            fastest).
        cv_folds: ``"auto"`` only: folds of the cross-validation that chooses between the
            bounded and unbounded search (``0``: the bound whenever it binds).
        lengthscale_draws: ``"auto"`` only: lengthscale draws of the final kernel's Laplace
            average (``0``: the kernel at the evidence maximum).
        local_search: ``"auto"`` only: after the refinement, the exact kernel's evidence on
            blocks of neighbouring rows from as many starts as the budget allows.

    Attributes:
        gp_ (RandomFeatureGP): the fitted solver (standardised targets).
        kernel_ (gpytorch.kernels.Kernel): the fitted kernel (with learned hyperparameters).
        noise_ (float): the noise variance in the units of ``y``.
        log_marginal_likelihood_value_ (float): log marginal likelihood of the standardised
            targets at the fitted hyperparameters.
        n_iter_ (int): optimiser iterations run (0 without ``optimizer``).
        fit_report_ (FitReport or None): what the recipe did (``"auto"`` only).
        n_features_in_ (int): number of input columns seen in ``fit``.

    Example:
        >>> from rfgp.sklearn import RandomFeatureGPRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-3, 3, size=(200, 1))
        >>> y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(200)
        >>> reg = RandomFeatureGPRegressor(num_features=128, random_state=0).fit(X, y)
        >>> mean, std = reg.predict(X[:3], return_std=True)
        >>> mean.shape, std.shape, bool(np.abs(mean - np.sin(X[:3, 0])).max() < 0.2)
        ((3,), (3,), True)

    References:
        Rahimi & Recht, *Random Features for Large-Scale Kernel Machines*, NeurIPS 2007.
        Rasmussen & Williams, *Gaussian Processes for Machine Learning*, Sec. 2.1, 2006.
    """

    def __init__(
        self,
        kernel: Any = "rbf",
        num_features: Optional[int] = None,
        lengthscale: float = 1.0,
        sampling: str = "iid",
        degree: int = 2,
        bias: float = 1.0,
        projection: str = "rademacher",
        noise: float = 0.1,
        optimizer: Optional[str] = "auto",
        max_iter: int = 200,
        normalize_y: bool = True,
        random_state: Any = None,
        time_budget: Optional[float] = None,
        max_lengthscale: Optional[float] = _REGRESSION_DEFAULTS.max_lengthscale,
        cv_folds: int = _REGRESSION_DEFAULTS.cv_folds,
        lengthscale_draws: int = _REGRESSION_DEFAULTS.lengthscale_draws,
        local_search: bool = _REGRESSION_DEFAULTS.local_search,
    ) -> None:
        _store_params(self, locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X: Any, y: Any) -> RandomFeatureGPRegressor:
        """Fit the GP (after optimising the hyperparameters when ``optimizer`` is set).

        Args:
            X: ``(n_samples, n_features)`` inputs.
            y: ``(n_samples,)`` or ``(n_samples, n_targets)`` targets.

        Returns:
            ``self``.
        """
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        # Strings that are not numbers fail here as in scikit-learn's regressors ("could not
        # convert string to float"); numeric strings are converted, as they are there.
        y = np.asarray(y).astype(np.float64)
        noise = _check_positive("noise", self.noise)
        if self.optimizer not in ("auto", "lbfgs", "adam", None):
            raise ValueError(
                f"optimizer must be 'auto', 'lbfgs', 'adam' or None, got {self.optimizer!r}"
            )
        _check_positive_int("max_iter", self.max_iter)
        if self.num_features is not None:
            _check_positive_int("num_features", self.num_features)
        seed = _seed(self.random_state)
        recipe = (self.optimizer == "auto" and isinstance(self.kernel, str)
                  and self.kernel in _RECIPE_KERNELS)
        # The recipe's options are checked whatever the path, as every parameter is.
        options = _recipe_options(
            RegressionOptions, self,
            ("max_iter", "time_budget", "max_lengthscale", "cv_folds", "lengthscale_draws",
             "local_search"),
            spectral=self.kernel if recipe else "rbf", seed=seed,
            num_features=self.num_features if recipe else None)
        self._y_mean, self._y_std = _target_scaling(y, bool(self.normalize_y))
        x_t = _as_tensor(X)
        y_t = _as_tensor((y - self._y_mean) / self._y_std)
        self.fit_report_ = None
        if recipe:
            gp = self._fit_recipe(x_t, y_t, options)
        else:
            kernel = _kernel_from(self, seed, X.shape[0])
            if isinstance(self.kernel, str):
                kernel = ScaleKernel(kernel).to(torch.float64)
            gp = RandomFeatureGP(kernel, noise=noise)
            self.n_iter_ = 0
            if self.optimizer is not None:
                # "auto" has no recipe for this kernel: it runs L-BFGS, as documented.
                method = "lbfgs" if self.optimizer == "auto" else self.optimizer
                self.n_iter_ = self._optimize(gp, x_t, y_t, method)
            gp.fit(x_t, y_t)
        self.gp_ = gp
        self.kernel_ = gp.kernel
        self.noise_ = (gp.noise.detach().double().numpy() * self._y_std**2).squeeze()
        self.log_marginal_likelihood_value_ = float(gp.log_marginal_likelihood())
        return self

    def _fit_recipe(self, x: torch.Tensor, y: torch.Tensor,
                    options: RegressionOptions) -> RandomFeatureGP:
        """The default recipe, :func:`rfgp.fit_auto`, with the estimator's options."""
        report = FitReport()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", NumericalWarning)
            gp = fit_auto(x, y, report=report, **vars(options))
        self.fit_report_ = report
        self.n_iter_ = sum(report.iterations.values())
        return gp

    def _optimize(self, gp: RandomFeatureGP, x: torch.Tensor, y: torch.Tensor,
                  method: str) -> int:
        """Maximise the log marginal likelihood over the kernel hyperparameters and the noise.

        Delegates to :meth:`RandomFeatureGP.optimize_hyperparameters` (bounded log-noise, a line
        search that backs off from unfactorisable points, the best point kept); returns the
        number of iterations run. A fit that stops at ``max_iter`` is not an error here.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", NumericalWarning)
            losses = gp.optimize_hyperparameters(
                x, y, method=method, num_iterations=int(self.max_iter)
            )
        return len(losses)

    def _scale(self, values: np.ndarray, power: int = 1) -> np.ndarray:
        return values * self._y_std**power

    def predict(self, X: Any, return_std: bool = False, return_cov: bool = False):
        """Posterior mean of ``f`` at ``X`` and optionally its standard deviation or covariance.

        The standard deviation and covariance are those of the latent function (add
        ``noise_`` for the distribution of a new observation).

        Args:
            X: ``(n_samples, n_features)`` query points.
            return_std: also return the standard deviation, same shape as the mean.
            return_cov: also return the covariance ``(n_samples, n_samples)`` (with several
                targets ``(n_samples, n_samples, n_targets)``).

        Returns:
            ``mean`` of shape ``(n_samples,)`` or ``(n_samples, n_targets)``, and ``std`` or
            ``cov`` if requested.
        """
        if return_std and return_cov:
            raise RuntimeError("at most one of return_std and return_cov can be requested")
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        x_t = _as_tensor(X)
        if return_cov:
            post = self.gp_.posterior(x_t)
            mean = post.mean.detach().numpy()
            cov = None if mean.ndim == 2 else post.covariance_matrix.detach().numpy()
            if mean.ndim == 2:
                # post[:, t] is the posterior of target t, whatever the row layout.
                cov = np.stack([post[:, t].covariance_matrix.detach().numpy()
                                for t in range(mean.shape[1])], axis=-1)
            return self._scale(mean) + self._y_mean, self._scale(cov, 2)
        if return_std:
            mean, std = self.gp_.predict(x_t, return_std=True)
            return self._scale(mean.numpy()) + self._y_mean, self._scale(std.numpy())
        return self._scale(self.gp_.predict(x_t).numpy()) + self._y_mean

    def sample_y(self, X: Any, n_samples: int = 1, random_state: Any = 0) -> np.ndarray:
        """Draw functions from the posterior and evaluate them at ``X``.

        The draws are exact posterior functions in weight space (consistent across all points
        of ``X``), without observation noise, as scikit-learn's ``GaussianProcessRegressor``.

        Args:
            X: ``(n_samples_X, n_features)`` query points.
            n_samples: number of functions.
            random_state: seed of the draws.

        Returns:
            ``(n_samples_X, n_samples)``, or ``(n_samples_X, n_targets, n_samples)`` for
            several targets.
        """
        check_is_fitted(self)
        n_samples = check_int("n_samples", n_samples)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        generator = torch.Generator().manual_seed(_seed(random_state))
        draws = self.gp_.sample_functions(n_samples, generator)(_as_tensor(X)).numpy()
        draws = self._scale(draws) + self._y_mean  # (S, M) or (S, M, T)
        return np.moveaxis(draws, 0, -1)


class RandomFeatureGPClassifier(ClassifierMixin, BaseEstimator):
    r"""Dirichlet-based GP classification with random features, as a scikit-learn estimator.

    The labels become ``C`` regression problems on the Dirichlet-transformed targets
    (Milios et al., 2018) with a fixed noise per point and class, solved in closed form by
    :class:`rfgp.DirichletGPClassifier` with a random-feature kernel. The class probabilities
    are :math:`p_c(x) = \mathbb{E}[\mathrm{softmax}(f(x))_c]` under the latent posterior
    :math:`f_c(x) \sim N(\mu_c(x), v_c(x))`; with ``proba_method="mc"`` a fixed set of
    ``mc_samples`` standard normal draws is shared by all rows, so the probabilities of a
    point do not depend on the other rows of ``X``.

    By default (``optimizer="auto"`` with a Fourier kernel: ``"rbf"`` or a Matérn) the fit is
    rfgp's classification recipe, :func:`rfgp.fit_classifier_auto`, with the same options
    (:class:`rfgp.recipes.ClassifierOptions`; ``random_state=s`` is its ``seed=s``): ARD
    lengthscales and the outputscale, shared by the ``C`` classes, maximise the summed
    evidence of the transformed labels, and the classifier is refitted on all rows with
    ``num_features`` features (default: the most the time budget allows for ``N`` rows and
    ``C`` classes); ``lengthscale`` and ``sampling`` are then not used and
    ``alpha_epsilon`` is kept. ``optimizer="validation"`` runs the same recipe, then
    chooses ``alpha_epsilon`` on a validation split. With ``optimizer=None`` (and with the
    other kernels) the kernel built from the arguments is used as it is.

    Args:
        kernel: a name in :data:`KERNELS` or a :class:`~rfgp.kernels.RandomFeatureKernel`,
            deep-copied at ``fit``.
        num_features: ``D`` of a named kernel; ``None`` chooses it from the number of rows
            and classes (:func:`rfgp.recipes.classification.plan_classifier`).
        lengthscale: lengthscale of a named kernel (not used by the recipe).
        sampling: frequency sampling of the Fourier kernels (``"iid"``, ``"orthogonal"``,
            ``"structured"``; the recipe uses orthogonal frequencies).
        degree: degree ``p`` of ``"polynomial"``.
        bias: bias ``b`` of ``"polynomial"``.
        projection: sketch of the dot-product kernels.
        alpha_epsilon: Dirichlet concentration added to every class.
        optimizer: ``"auto"`` (the recipe), ``"validation"`` (the recipe, or the kernel as
            given for the other kernels, then ``alpha_epsilon`` chosen from
            :data:`rfgp.classification.ALPHA_GRID` by the MNLL on a random 10% validation split,
            :meth:`rfgp.DirichletGPClassifier.select_alpha`, and a refit on all data) or
            ``None`` (keep the hyperparameters).
        max_iter: L-BFGS iterations of the recipe's evidence search.
        proba_method: ``"mc"``, ``"mean_field"`` or ``"lognormal"`` (see
            :func:`rfgp.classification.softmax_expectation`).
        mc_samples: Monte Carlo samples of ``"mc"``.
        random_state: seed (int, ``RandomState`` or ``None``) of the features and draws.

    Attributes:
        classes_ (ndarray): the class labels (any type ``np.unique`` sorts).
        classifier_ (DirichletGPClassifier): the fitted model (labels ``0 .. C-1``).
        fit_report_ (ClassifierFitReport or None): what the recipe did (recipe fits only).
        n_iter_ (int): L-BFGS iterations of the recipe (0 without it).
        n_features_in_ (int): number of input columns seen in ``fit``.

    Example:
        >>> from sklearn.datasets import load_iris
        >>> from rfgp.sklearn import RandomFeatureGPClassifier
        >>> X, y = load_iris(return_X_y=True)
        >>> X = (X - X.mean(0)) / X.std(0)
        >>> clf = RandomFeatureGPClassifier(random_state=0).fit(X, y)
        >>> clf.predict_proba(X[:2]).shape, bool(clf.score(X, y) > 0.9)
        ((2, 3), True)

    References:
        Milios, Camoriano, Michiardi, Rosasco, Filippone, *Dirichlet-based Gaussian Processes
        for Large-scale Calibrated Classification*, NeurIPS 2018.
    """

    def __init__(
        self,
        kernel: Any = "rbf",
        num_features: Optional[int] = None,
        lengthscale: float = 1.0,
        sampling: str = "iid",
        degree: int = 2,
        bias: float = 1.0,
        projection: str = "rademacher",
        alpha_epsilon: float = 0.01,
        optimizer: Optional[str] = "auto",
        max_iter: int = 200,
        proba_method: str = "mc",
        mc_samples: int = 1000,
        random_state: Any = None,
    ) -> None:
        _store_params(self, locals())

    def fit(self, X: Any, y: Any) -> RandomFeatureGPClassifier:
        """Fit one latent GP per class to the Dirichlet-transformed labels.

        Args:
            X: ``(n_samples, n_features)`` inputs.
            y: ``(n_samples,)`` labels of any type (at least two classes).

        Returns:
            ``self``.
        """
        X, y = validate_data(self, X, y, dtype=np.float64)
        y = column_or_1d(y, warn=True)
        try:
            check_classification_targets(y)
        except TypeError as error:
            # Labels that cannot be sorted together (1 and "a") fail with this TypeError in
            # scikit-learn's own classifiers too; this one says why.
            names = sorted({type(v).__name__ for v in y.tolist()})
            raise TypeError(
                "y must hold labels of one kind, all strings or all numbers (as scikit-learn's "
                f"encoders require), got a mix of {names}"
            ) from error
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 classes in y, got "
                f"{len(self.classes_)} class"
            )
        if self.optimizer not in ("auto", "validation", None):
            raise ValueError(
                f"optimizer must be 'auto', 'validation' or None, got {self.optimizer!r}"
            )
        if self.proba_method not in PROBA_METHODS:
            raise ValueError(
                f"proba_method must be one of {list(PROBA_METHODS)}, got {self.proba_method!r}"
            )
        _check_positive_int("mc_samples", self.mc_samples)
        _check_positive_int("max_iter", self.max_iter)
        alpha = _check_positive("alpha_epsilon", self.alpha_epsilon)
        num_features = self.num_features
        if num_features is not None:
            num_features = _check_positive_int("num_features", num_features)
        seed = _seed(self.random_state)
        x_t, labels = _as_tensor(X), torch.as_tensor(encoded, dtype=torch.long)
        num_classes = len(self.classes_)
        recipe = isinstance(self.kernel, str) and self.kernel in _RECIPE_KERNELS
        options = _recipe_options(
            ClassifierOptions, self, ("max_iter", "alpha_epsilon"),
            spectral=self.kernel if recipe else "rbf",
            num_features=num_features if recipe else None, num_classes=num_classes,
            select_alpha=self.optimizer == "validation", num_samples=int(self.mc_samples),
            seed=seed)
        self.fit_report_ = None
        self.n_iter_ = 0
        if self.optimizer is not None and recipe:
            report = ClassifierFitReport()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                warnings.simplefilter("ignore", NumericalWarning)
                model = fit_classifier_auto(x_t, labels, report=report, **vars(options))
            self.fit_report_ = report
            self.n_iter_ = sum(report.iterations.values())
        else:
            if isinstance(self.kernel, str):
                if num_features is None:
                    num_features = plan_classifier(X.shape[0], X.shape[1], num_classes,
                                                   options).num_features
                kernel = make_kernel(
                    self.kernel, num_features, self.lengthscale, self.sampling, self.degree,
                    self.bias, self.projection, seed,
                )
            else:
                kernel = _kernel_from(self, seed, X.shape[0])
            model = DirichletGPClassifier(
                kernel, alpha_epsilon=alpha, num_classes=num_classes, seed=seed,
            )
            if self.optimizer == "validation":
                model.select_alpha(x_t, labels, seed=seed)
            else:
                model.fit(x_t, labels)
        self.classifier_ = model
        self._draw_seed = seed
        return self

    def _probabilities(self, X: Any, log: bool) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        post = self.classifier_.latent_posterior(_as_tensor(X))
        # Monte Carlo draws from a fixed seed are shared by all rows: a row's probabilities do
        # not depend on the other rows of X.
        generator = torch.Generator().manual_seed(self._draw_seed)
        proba = softmax_expectation(
            post.mean, post.variance, method=self.proba_method,
            num_samples=int(self.mc_samples), generator=generator, log=log,
        )
        return proba.numpy()

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(n_samples, n_classes)``, columns in the order of ``classes_``.

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples, n_classes)`` array whose rows sum to 1.
        """
        return self._probabilities(X, log=False)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Log class probabilities, averaged in log space (accurate where they underflow).

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples, n_classes)`` array; ``logsumexp`` of every row is 0.
        """
        return self._probabilities(X, log=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of every row.

        Args:
            X: ``(n_samples, n_features)`` inputs.

        Returns:
            ``(n_samples,)`` array of labels, with the type of ``classes_``.
        """
        proba = self.predict_proba(X)  # checks that the estimator is fitted
        return self.classes_[np.argmax(proba, axis=1)]
