"""The scikit-learn regressor: :class:`RandomFeatureGPRegressor`."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np
import torch
from gpytorch.kernels import ScaleKernel
from linear_operator.utils.warnings import NumericalWarning
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from rfgp._data import ScaledTargets, ShardedSource, open_source, target_moments
from rfgp._validation import check_bool, check_int
from rfgp.inference._feature_gp import ConvergenceWarning, RandomFeatureGP
from rfgp.recipes import (
    FitReport,
    RegressionOptions,
    fit_auto,
)
from rfgp.sklearn._support import (
    RECIPE_KERNELS,
    REGRESSION_DEFAULTS,
    as_tensor,
    check_params,
    kernel_from,
    recipe_options,
    seed_from,
    store_params,
    target_scaling,
)

__all__ = ["RandomFeatureGPRegressor"]

# Rows of a memory-mapped query predicted at once.
_PREDICT_ROWS = 65536


class RandomFeatureGPRegressor(RegressorMixin, BaseEstimator):
    r"""Random-feature GP regression as a scikit-learn estimator.

    The model is :math:`y = m + s\,f(x) + \varepsilon` with
    :math:`f \sim GP(0, \sigma_f^2 \hat k)`, :math:`\hat k(x, x') = \Phi(x)^\top
    \overline{\Phi(x')}` a random-feature kernel with ``D`` features, and
    :math:`\varepsilon \sim N(0, s^2 \sigma^2)`, where ``m``, ``s`` standardise the targets
    (``normalize_y``) and, by the recipe, :math:`f` has the constant prior mean it chose
    (``gp_.prior_mean``, standardised units). Fitting costs :math:`O(N D^2 + D^3)`
    (:class:`rfgp.RandomFeatureGP`).

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
            and the time budget (:func:`rfgp.recipes._regression.plan_regression`; at most 8192
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
        normalize_y: (a bool) standardise the targets (mean and standard deviation per
            column); otherwise only the zero prior mean is used. With ``"auto"``, targets
            without variation (constant columns, or zeros) are refused naming ``y``: the
            evidence that chooses the scales has no maximum there.
        random_state: seed (an int in ``[0, 2**64 - 1]`` is the seed itself, the recipes'
            ``seed``; a ``RandomState`` or ``None`` draws one) of the random features. A given
            kernel keeps its own weights when ``None``.
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
        distributed: ``"auto"`` only: each ``torch.distributed`` process calls ``fit`` with
            its own shard of the rows (:func:`rfgp.fit_auto`'s ``distributed=True``); every
            process gets the same model. The targets are standardised by the mean and
            standard deviation of all shards.

    Rows not in memory: ``fit`` also takes a float32 or float64 numpy memory-map ``X``
    (``np.load(path, mmap_mode="r")``, with ``y`` an array or memory-map, read in ``X``'s
    dtype) or a re-iterable of ``(X, y)``
    chunks with ``y=None`` (a ``DataLoader``, a list, a callable returning an iterator); the
    recipe then reads a seeded draw of rows for its search and streams the rest (see
    :func:`rfgp.fit_auto`), and the targets are standardised by streamed moments.
    ``predict`` takes a memory-map in chunks.

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
        max_lengthscale: Optional[float] = REGRESSION_DEFAULTS.max_lengthscale,
        cv_folds: int = REGRESSION_DEFAULTS.cv_folds,
        lengthscale_draws: int = REGRESSION_DEFAULTS.lengthscale_draws,
        local_search: bool = REGRESSION_DEFAULTS.local_search,
        distributed: bool = False,
    ) -> None:
        store_params(self, locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X: Any, y: Any = None) -> RandomFeatureGPRegressor:
        """Fit the GP (after optimising the hyperparameters when ``optimizer`` is set).

        Args:
            X: ``(n_samples, n_features)`` inputs (a memory-map, or a source of ``(X, y)``
                chunks, is streamed: see the class docstring).
            y: ``(n_samples,)`` or ``(n_samples, n_targets)`` targets (``None`` for chunks).

        Returns:
            ``self``.
        """
        # A memory-map streams where the recipe fits; the other paths read it into memory.
        mapped = (isinstance(X, np.memmap) and X.dtype in (np.float32, np.float64)
                  and self.optimizer == "auto" and isinstance(self.kernel, str)
                  and self.kernel in RECIPE_KERNELS)
        if self.distributed or mapped or (y is None and not isinstance(X, np.ndarray)):
            return self._fit_streamed(X, y)
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        # Strings that are not numbers fail here as in scikit-learn's regressors ("could not
        # convert string to float"); numeric strings are converted, as they are there.
        y = np.asarray(y).astype(np.float64)
        noise = check_params(self)["noise"]
        seed = seed_from(self.random_state)
        recipe = (self.optimizer == "auto" and isinstance(self.kernel, str)
                  and self.kernel in RECIPE_KERNELS)
        # The recipe's options are checked whatever the path, as every parameter is.
        options = recipe_options(
            RegressionOptions, self,
            ("max_iter", "time_budget", "max_lengthscale", "cv_folds", "lengthscale_draws",
             "local_search"),
            spectral=self.kernel if recipe else "rbf", seed=seed,
            num_features=self.num_features if recipe else None)
        self._y_mean, self._y_std = target_scaling(y, bool(self.normalize_y))
        x_t = as_tensor(X)
        y_t = as_tensor((y - self._y_mean) / self._y_std)
        self.fit_report_ = None
        if recipe:
            if not np.any(y - self._y_mean):
                # The recipe's evidence has no maximum on targets without variation; say so
                # in the estimator's terms (fit_auto would see the centred zeros).
                got = ("every target column is constant (zero once normalize_y centres it)"
                       if self.normalize_y else "every target is zero")
                raise ValueError(
                    f"y must vary, got {X.shape[0]} sample{'s' * (X.shape[0] != 1)} where "
                    f"{got}: the evidence by which "
                    "optimizer='auto' chooses the outputscale and the noise has no maximum "
                    "(it grows without bound as both shrink to zero)"
                )
            gp = self._fit_recipe(x_t, y_t, options)
        else:
            kernel = kernel_from(self, seed, X.shape[0])
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

    def _fit_streamed(self, X: Any, y: Any) -> RandomFeatureGPRegressor:
        """The recipe on rows it reads in chunks (a memory-map, chunks, process shards)."""
        if not (self.optimizer == "auto" and isinstance(self.kernel, str)
                and self.kernel in RECIPE_KERNELS):
            raise ValueError(
                "rows from a memory-map, chunks or process shards are fitted by the recipe "
                f"only: optimizer='auto' with kernel in {list(RECIPE_KERNELS)}, got "
                f"optimizer={self.optimizer!r}, kernel={self.kernel!r}"
            )
        check_params(self)
        options = recipe_options(
            RegressionOptions, self,
            ("max_iter", "time_budget", "max_lengthscale", "cv_folds", "lengthscale_draws",
             "local_search", "distributed"),
            spectral=self.kernel, seed=seed_from(self.random_state),
            num_features=self.num_features)
        if isinstance(X, np.ndarray) and y is not None and np.asarray(y).dtype != X.dtype:
            # The targets in the inputs' dtype, as the recipe computes (a copy of y only).
            y = np.asarray(y, dtype=X.dtype)
        source = open_source(X, y, bool(self.distributed))
        if self.normalize_y:
            self._y_mean, self._y_std = target_moments(source)
        else:
            self._y_mean = np.zeros(source.target_shape)
            self._y_std = np.ones(source.target_shape)
        scaled = ScaledTargets(source, self._y_mean, self._y_std)
        if isinstance(source, ShardedSource):
            # The shards, read again, with the targets standardised by all of them.
            scaled = ShardedSource(lambda: ScaledTargets(source.localsource, self._y_mean,
                                                         self._y_std), source.group)
        self.n_features_in_ = source.input_dim
        gp = self._fit_recipe(scaled, None, options)
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

    def predict(self, X: Any, return_std: bool = False, return_cov: bool = False,
                observation_noise: bool = False):
        """Posterior mean of ``f`` at ``X`` and optionally its standard deviation or covariance.

        The standard deviation and covariance are those of the latent function, or with
        ``observation_noise=True`` those of new observations (``noise_`` added to each
        variance). A fit on the iterative path (``solve="cg"``) computes its variances to a
        relative tolerance of what is returned: of new observations, where the noise
        dominates, at a fraction of the latent variances' cost.

        Args:
            X: ``(n_samples, n_features)`` query points.
            return_std: also return the standard deviation, same shape as the mean.
            return_cov: also return the covariance ``(n_samples, n_samples)`` (with several
                targets ``(n_samples, n_samples, n_targets)``).
            observation_noise: the standard deviation or covariance of a new observation
                ``y`` rather than of ``f`` (needs ``return_std`` or ``return_cov``).

        Returns:
            ``mean`` of shape ``(n_samples,)`` or ``(n_samples, n_targets)``, and ``std`` or
            ``cov`` if requested.
        """
        if return_std and return_cov:
            raise RuntimeError("at most one of return_std and return_cov can be requested")
        if check_bool("observation_noise", observation_noise) and not (return_std or return_cov):
            raise ValueError(
                "observation_noise=True adds noise_ to the standard deviation or covariance, "
                "which only return_std=True or return_cov=True returns"
            )
        check_is_fitted(self)
        if (isinstance(X, np.memmap) and X.dtype in (np.float32, np.float64)
                and not return_cov):
            # Read chunk by chunk by the model's predict: a memory-map is never copied whole.
            if X.ndim != 2 or X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has shape {X.shape}, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input"
                )
            with torch.no_grad():
                out = self.gp_.predict(X, return_std=return_std, chunk_size=_PREDICT_ROWS,
                                       observation_noise=observation_noise)
            if not return_std:
                return self._scale(out.double().numpy()) + self._y_mean
            mean, std = out
            return (self._scale(mean.double().numpy()) + self._y_mean,
                    self._scale(std.double().numpy()))
        X = validate_data(self, X, reset=False, dtype=np.float64)
        x_t = as_tensor(X)
        if return_cov:
            post = self.gp_.posterior(x_t)
            mean = post.mean.detach().numpy()
            cov = None if mean.ndim == 2 else post.covariance_matrix.detach().numpy()
            if mean.ndim == 2:
                # post[:, t] is the posterior of target t, whatever the row layout.
                cov = np.stack([post[:, t].covariance_matrix.detach().numpy()
                                for t in range(mean.shape[1])], axis=-1)
            cov = self._scale(cov, 2)
            if observation_noise:
                rows = np.arange(cov.shape[0])
                cov[rows, rows] += self.noise_  # noise_ per target broadcasts along the last
            return self._scale(mean) + self._y_mean, cov
        if return_std:
            mean, std = self.gp_.predict(x_t, return_std=True,
                                         observation_noise=observation_noise)
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
        generator = torch.Generator().manual_seed(seed_from(random_state))
        draws = self.gp_.sample_functions(n_samples, generator)(as_tensor(X)).numpy()
        draws = self._scale(draws) + self._y_mean  # (S, M) or (S, M, T)
        return np.moveaxis(draws, 0, -1)
