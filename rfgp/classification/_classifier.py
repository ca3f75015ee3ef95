r"""Dirichlet-based GP classification (Milios et al., 2018) on exact and random-feature kernels.

References:
    D. Milios, R. Camoriano, P. Michiardi, L. Rosasco, M. Filippone. Dirichlet-based Gaussian
    processes for large-scale calibrated classification. NeurIPS 2018.

    J. Wacker, M. Kanagawa, M. Filippone. Improved random features for dot product kernels.
    Appendix D.4 (classification with complex random features).
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from rfgp._softmax import PROBA_METHODS, softmax_expectation
from rfgp._validation import (
    check_bool,
    check_choice,
    check_int,
    check_positive,
    check_positive_values,
    check_real_values,
    describe,
)
from rfgp.classification._exact import DirichletExactGP
from rfgp.classification._inputs import base_kernel, check_inputs, encode_labels
from rfgp.classification._selection import ALPHA_GRID, select_alpha
from rfgp.inference._fingerprint import Fingerprint
from rfgp.kernels._base import RandomFeatureKernel
from rfgp.kernels._composition import as_feature_kernel, is_feature_composition
from rfgp.likelihoods import DirichletLikelihood

__all__ = ["DirichletGPClassifier"]

_UNPICKLABLE_DTYPES = (torch.uint16, torch.uint32, torch.uint64)
_NUMPY_CLASSES = "classes as a NumPy array"


class DirichletGPClassifier:
    r"""Dirichlet-based GP classifier with a closed-form posterior (Milios et al., 2018).

    Each of the ``C`` classes is a GP regression on the transformed targets of
    :class:`~rfgp.likelihoods.DirichletLikelihood` with its own heteroscedastic noise. With a
    random-feature kernel (a :class:`rfgp.kernels.RandomFeatureKernel` or a ``ScaleKernel``
    around one; real or complex features) the posterior is computed by
    :class:`rfgp.RandomFeatureGP`: one ``D x D`` (or ``N x N`` when ``N < D``) factorisation per
    class. A class's noise takes one value on its own rows and another on the rest, so the ``C``
    weighted Gram matrices come from one shared :math:`\Phi^\top\Phi` plus one product over each
    class's rows: cost :math:`O(2 N D^2 + C D^3)` instead of :math:`O(C (N D^2 + D^3))`. Any
    other GPyTorch kernel gives the exact Dirichlet GP (:class:`DirichletExactGP`, one
    ``N x N`` Cholesky per class, :math:`O(C N^3)`), the reference the random-feature models are
    measured against. Kernels with several outputs per input (vector-field kernels) are refused:
    they would couple the class latents.

    The default way to fit one, with ARD lengthscales and an outputscale learned from the
    evidence of the transformed labels, is :func:`rfgp.classification.fit_classifier_auto`;
    this class fits a given kernel as it is.

    Labels are integer class ids; the classes are their sorted distinct values (``classes_``,
    as in scikit-learn), or ``0 .. num_classes - 1`` when ``num_classes`` is given.

    The prior variance: the kernel is multiplied by ``outputscale``; ``"auto"`` sets it to the
    variance of the (centred) transformed targets over all entries, as the papers' code does
    (pass ``1.0`` when the kernel carries its own ``ScaleKernel``).

    A fit never goes stale silently: predicting after a change of the kernel's parameters or
    buffers, of the likelihood's noise or of ``alpha_epsilon`` / ``centre`` / ``outputscale`` /
    ``num_classes`` raises a ``RuntimeError`` asking for a new :meth:`fit`.

    Args:
        kernel: a GPyTorch kernel (random-feature or exact), shared by all classes. A sum /
            product tree of random-feature kernels is turned into one feature map
            (:func:`rfgp.kernels.as_feature_kernel`) and takes the weight-space path.
        alpha_epsilon: Dirichlet concentration added to every class; choose it with
            :meth:`select_alpha` on the grid :data:`ALPHA_GRID`.
        num_classes: ``C``; ``None`` takes the distinct labels at :meth:`fit`.
        centre: centre the transformed targets per class (see
            :class:`~rfgp.likelihoods.DirichletLikelihood`).
        outputscale: ``"auto"`` or a positive float (the kernel variance :math:`s^2`).
        num_samples: default Monte Carlo samples of :meth:`predict_proba`.
        seed: seed of the Monte Carlo draws (``None``: the global RNG).
        temperature: :math:`T` of the probabilities :math:`\mathbb{E}[\mathrm{softmax}(f /
            T)]` (default 1, the model's own map); :func:`rfgp.classification.
            fit_classifier_auto` chooses it by the held-out NLL. ``T < 1`` sharpens the
            probabilities: the Dirichlet transform caps the latent means a fit can reach
            (two classes at ``alpha_epsilon = 0.1``: a top probability of about 0.96), which
            a temperature lifts where held-out rows show it.
        class_map: ``None`` (default) or a pair ``(s, o)`` of ``(C,)`` tensors, a per-class
            affine map of the latents: the probabilities become
            :math:`\mathbb{E}[\mathrm{softmax}((s \odot f + o) / T)]`.
            :func:`rfgp.classification.fit_classifier_auto` sets it where it cross-validates
            better than a temperature on held-out rows (see :attr:`class_map`).
        **solver_kwargs: passed to :class:`rfgp.RandomFeatureGP` (``complex_posterior``,
            ``solve`` = ``"auto"``/``"weight"``/``"function"``, ``jitter``); the exact path
            takes ``jitter`` only.

    Attributes:
        classes_ (Tensor): ``(C,)`` the class ids, in the dtype of the labels (unsigned 64-bit
            ids included); column ``c`` of the probabilities is ``classes_[c]``.
        num_classes_ (int): ``C``.
        likelihood (DirichletLikelihood): the transform of the last fit.
        gp: the fitted :class:`rfgp.RandomFeatureGP` or :class:`DirichletExactGP`.
        outputscale_ (float): the kernel variance used in the last fit.
        selection_ (list of dict): the rows of the last :meth:`select_alpha`.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(40, 2, generator=g, dtype=torch.float64)
        >>> x[20:] += 6
        >>> labels = torch.cat([torch.zeros(20), torch.ones(20)]).long()
        >>> clf = DirichletGPClassifier(FourierFeatureKernel(256, seed=0), seed=0)
        >>> clf = clf.fit(x, labels)
        >>> (clf.predict(x) == labels).all().item()
        True

    References:
        Milios et al. (2018); Wacker, Kanagawa, Filippone, Appendix D.4.
    """

    def __init__(
        self,
        kernel: Kernel,
        alpha_epsilon: float = 0.01,
        num_classes: Optional[int] = None,
        centre: bool = True,
        outputscale: Union[str, float] = "auto",
        num_samples: int = 1000,
        seed: Optional[int] = None,
        temperature: float = 1.0,
        class_map: Optional[Tuple[Any, Any]] = None,
        **solver_kwargs: Any,
    ) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
        # Sums and products of feature kernels take the weight-space path as one feature map.
        self.kernel = as_feature_kernel(kernel) if is_feature_composition(kernel) else kernel
        self.alpha_epsilon = check_positive("alpha_epsilon", alpha_epsilon)
        self.num_classes = None if num_classes is None else check_int(
            "num_classes", num_classes, minimum=2
        )
        self.centre = check_bool("centre", centre)
        if isinstance(outputscale, str):
            check_choice("outputscale", outputscale, ("auto",))
        else:
            outputscale = check_positive("outputscale", outputscale)
        self.outputscale = outputscale
        self.num_samples = check_int("num_samples", num_samples)
        if seed is not None:
            seed = check_int("seed", seed, minimum=None)
        self.seed = seed
        self.temperature = temperature
        self.class_map = class_map
        self.solver_kwargs = solver_kwargs
        self.likelihood: Optional[DirichletLikelihood] = None
        self.gp: Any = None
        self.outputscale_: Optional[float] = None
        self.selection_: List[Dict[str, Any]] = []
        self.fit_time_: Optional[float] = None

    # PyTorch cannot pickle uint16/32/64 tensors (torch.save can): class ids of those dtypes
    # travel as a NumPy array and come back as the same tensor.
    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        classes = state.get("classes_")
        if isinstance(classes, Tensor) and classes.dtype in _UNPICKLABLE_DTYPES:
            state["classes_"] = (_NUMPY_CLASSES, classes.cpu().numpy(), str(classes.device))
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state.setdefault("_temperature", 1.0)  # pickled before the temperature existed
        state.setdefault("_class_map", None)  # pickled before the class map existed
        classes = state.get("classes_")
        if isinstance(classes, tuple) and classes and classes[0] == _NUMPY_CLASSES:
            state["classes_"] = torch.from_numpy(classes[1]).to(classes[2])
        self.__dict__.update(state)

    @property
    def is_random_feature(self) -> bool:
        """Whether the kernel is a random-feature kernel (else the exact GP is used)."""
        return isinstance(base_kernel(self.kernel), RandomFeatureKernel)

    @property
    def temperature(self) -> float:
        r"""The temperature :math:`T` of the probabilities :math:`\mathbb{E}[\mathrm{softmax}(f
        / T)]` (a finite real ``> 0``; 1 is the model's own map). It changes the probabilities
        only, not the posterior: set it after a fit without refitting."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_positive("temperature", value)

    @property
    def class_map(self) -> Optional[Tuple[Tensor, Tensor]]:
        r"""``None`` or ``(s, o)``, ``(C,)`` float64 each: the per-class affine map of the
        latents the probabilities are read on, :math:`\mathbb{E}[\mathrm{softmax}((s \odot
        f + o) / T)]`. ``s`` must be finite and positive, ``o`` finite, both one-dimensional
        and of one length (checked against the fitted classes at prediction). Like the
        temperature it changes the probabilities only: set it after a fit without refitting.

        Example:
            >>> from rfgp.kernels import FourierFeatureKernel
            >>> clf = DirichletGPClassifier(FourierFeatureKernel(8, seed=0))
            >>> clf.class_map = ([1.0, 2.0], [0.5, -0.5])
            >>> clf.class_map[0]
            tensor([1., 2.], dtype=torch.float64)
        """
        if self._class_map is None:
            return None
        return self._class_map[0].clone(), self._class_map[1].clone()

    @class_map.setter
    def class_map(self, value: Optional[Tuple[Any, Any]]) -> None:
        if value is None:
            self._class_map = None
            return
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise TypeError(
                f"class_map must be None or a pair (scales, offsets), got {describe(value)}"
            )
        like = torch.zeros((), dtype=torch.float64)
        scales = check_positive_values("class_map scales", value[0], like)
        offsets = check_real_values("class_map offsets", value[1], like)
        if scales.dim() != 1 or offsets.dim() != 1 or scales.shape != offsets.shape:
            raise ValueError(
                "class_map must hold two one-dimensional tensors of one length (one entry per "
                f"class), got shapes {tuple(scales.shape)} and {tuple(offsets.shape)}"
            )
        if scales.numel() < 2:
            raise ValueError(
                f"class_map must have one entry per class (at least 2), got {scales.numel()}"
            )
        self._class_map = (scales.detach().cpu().clone(), offsets.detach().cpu().clone())

    def _settings(self) -> tuple:
        return (self.alpha_epsilon, self.centre, self.outputscale, self.num_classes)

    def _check_kernel(self, x: Tensor) -> None:
        base = base_kernel(self.kernel)
        outputs = base.num_outputs_per_input(x[:1], x[:1])  # GPyTorch's signature
        if outputs != 1:
            raise ValueError(
                f"kernel must have one output per input, got {type(base).__name__} with "
                f"{outputs} outputs per input (a vector-field kernel would couple the class "
                "latents); use a scalar kernel such as FourierFeatureKernel"
            )

    # -------------------------------------------------------------- fitting
    def fit(self, x: Any, labels: Any) -> DirichletGPClassifier:
        """Fit the ``C`` latent GPs to the transformed labels in closed form.

        Args:
            x: ``(N, d)`` inputs (floating dtype; the posterior is computed in this dtype).
            labels: ``(N,)`` integer class ids (see :func:`encode_labels`).

        Returns:
            ``self``.
        """
        start = time.perf_counter()
        x = check_inputs(x)
        indices, classes = encode_labels(labels, self.num_classes)
        if indices.shape[0] != x.shape[0]:
            raise ValueError(
                f"labels must have one entry per row of x ({x.shape[0]}), got {indices.shape[0]}"
            )
        self._check_kernel(x)
        num_classes = classes.numel()
        likelihood = DirichletLikelihood(num_classes, self.alpha_epsilon, centre=self.centre)
        targets = likelihood.set_train_labels(indices, dtype=x.dtype)  # [C, N]
        noise = likelihood.noise  # [C, N]
        if self.outputscale == "auto":
            scale2 = float(targets.var(unbiased=False)) if self.centre else float(
                targets.pow(2).mean()
            )
        else:
            scale2 = float(self.outputscale)
        likelihood = likelihood.to(device=x.device)
        if self.is_random_feature:
            from rfgp.inference._feature_gp import RandomFeatureGP

            scale = math.sqrt(scale2)
            gp = RandomFeatureGP(self.kernel, **self.solver_kwargs)
            # A GP with kernel s^2 k on (y, S) is the GP with kernel k on (y / s, S / s^2).
            gp.fit(x, (targets / scale).transpose(0, 1), noise=(noise / scale2).transpose(0, 1))
        else:
            unknown = sorted(set(self.solver_kwargs) - {"jitter"})
            if unknown:
                raise ValueError(
                    f"solver options {unknown} apply to random-feature kernels only; the exact "
                    f"path ({type(base_kernel(self.kernel)).__name__}) takes jitter only"
                )
            gp = DirichletExactGP(x, likelihood, self.kernel, outputscale=scale2,
                                  jitter=self.solver_kwargs.get("jitter"))
        self.classes_ = classes.to(x.device)
        self.num_classes_ = num_classes
        self.likelihood = likelihood
        self.outputscale_ = scale2
        self.gp = gp
        self._train_size = x.shape[0]
        self._input_dim = x.shape[1]
        self._fit_settings = self._settings()
        self._fit_state = Fingerprint.of(self.kernel, self._likelihood_tensors())
        self.fit_time_ = time.perf_counter() - start
        return self

    def _likelihood_tensors(self) -> Dict[str, Tensor]:
        return {"likelihood.noise": self.likelihood.noise,
                "likelihood.class_offsets": self.likelihood.class_offsets}

    def _check_fitted(self) -> None:
        if self.gp is None:
            raise RuntimeError("DirichletGPClassifier is not fitted; call fit(x, labels) first")
        changed = [] if self._settings() == self._fit_settings else ["settings"]
        changed += self._fit_state.changes(self.kernel, self._likelihood_tensors())
        if changed:
            raise RuntimeError(
                f"DirichletGPClassifier: {', '.join(changed)} changed since fit; the fitted "
                "posterior no longer matches the model, call fit(x, labels) again"
            )

    # -------------------------------------------------------------- latent posterior
    def _latent_moments(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Mean and variance, ``(M, C)``, of the latents including offsets and outputscale."""
        self._check_fitted()
        x = check_inputs(x)
        if x.shape[1] != self._input_dim:
            raise ValueError(
                f"x must have {self._input_dim} columns like the training inputs, got "
                f"{describe(x)}"
            )
        offsets = self.likelihood.class_offsets
        if x.shape[0] == 0:
            empty = x.new_zeros(0, self.num_classes_)
            return empty, empty.clone()
        if self.is_random_feature:
            mean, std = self.gp.predict(x, return_std=True)
            mean = mean.reshape(x.shape[0], -1) * math.sqrt(self.outputscale_)
            var = std.reshape(x.shape[0], -1).pow(2) * self.outputscale_
        else:
            mean, var = self.gp.latent_moments(x)
        return mean + offsets.to(mean), var

    def latent_posterior(self, x: Any) -> torch.distributions.Normal:
        r"""Pointwise posterior of the latent functions :math:`f_c(x)` (noise-free).

        The classes are independent a posteriori; the mean includes the class offsets removed
        by centring and the ``outputscale``, so ``softmax`` of a draw is a draw of the class
        probabilities.

        Args:
            x: ``(M, d)`` inputs.

        Returns:
            ``torch.distributions.Normal`` with ``loc`` and ``scale`` of shape ``(M, C)``.
        """
        mean, var = self._latent_moments(x)
        return torch.distributions.Normal(mean, var.clamp_min(0.0).sqrt(), validate_args=False)

    def probability_moments(self, x: Any) -> Tuple[Tensor, Tensor]:
        r"""Mean and variance ``(M, C)`` of :math:`(s \odot f(x) + o) / T`, whose softmax's
        expectation the probabilities are (:attr:`temperature` :math:`T`, :attr:`class_map`
        :math:`(s, o)`, by default ones and zeros)."""
        mean, var = self._latent_moments(x)
        if self._class_map is not None:
            scales, offsets = self._class_map
            if scales.numel() != mean.shape[1]:
                raise ValueError(
                    f"class_map has {scales.numel()} entries, but the classifier was fitted "
                    f"with {mean.shape[1]} classes"
                )
            scales, offsets = scales.to(mean), offsets.to(mean)
            mean, var = mean * scales + offsets, var * scales.square()
        t = self._temperature
        return (mean, var) if t == 1.0 else (mean / t, var / (t * t))

    # -------------------------------------------------------------- prediction
    def predict_proba(
        self,
        x: Any,
        num_samples: Optional[int] = None,
        method: str = "mc",
        generator: Optional[torch.Generator] = None,
        log: bool = False,
    ) -> Tensor:
        r"""Class probabilities :math:`\mathbb{E}[\mathrm{softmax}((s \odot f(x) + o) / T)]`,
        :math:`T` the :attr:`temperature` and :math:`(s, o)` the :attr:`class_map` (by default
        :math:`\mathbb{E}[\mathrm{softmax}(f(x) / T)]`).

        Args:
            x: ``(M, d)`` inputs (``M = 0`` gives a ``(0, C)`` result).
            num_samples: Monte Carlo samples (default: the constructor's ``num_samples``).
            method: ``"mc"`` (Monte Carlo, the papers' choice), ``"mean_field"`` (deterministic
                pairwise-probit approximation; errors documented in
                :func:`~rfgp.classification.softmax_expectation`) or ``"lognormal"``.
            generator: ``torch.Generator`` for the draws; default: seeded from ``seed``.
            log: return log-probabilities, computed in log space (accurate when tiny).

        Returns:
            ``(M, C)`` probabilities (rows sum to one), columns in the order of ``classes_``.
        """
        check_choice("method", method, PROBA_METHODS)
        mean, var = self.probability_moments(x)
        if generator is None and self.seed is not None:
            generator = torch.Generator(device=mean.device).manual_seed(self.seed)
        return softmax_expectation(
            mean,
            var,
            method=method,
            num_samples=self.num_samples if num_samples is None else num_samples,
            generator=generator,
            log=log,
        )

    def predict_log_proba(self, x: Any, **kwargs: Any) -> Tensor:
        """Log class probabilities from the log-space path of :meth:`predict_proba`
        (``log=True``): accurate where the probabilities underflow."""
        return self.predict_proba(x, log=True, **kwargs)

    def predict(self, x: Any, method: str = "mc", **kwargs: Any) -> Tensor:
        """The most probable class id, ``classes_[argmax]`` of :meth:`predict_proba`; ``(M,)``."""
        proba = self.predict_proba(x, method=method, **kwargs)
        return self.classes_[proba.argmax(dim=-1)]

    def log_marginal_likelihood(self) -> float:
        r"""Log marginal likelihood of the transformed targets, summed over the classes.

        :math:`\sum_c \log \mathcal{N}(\tilde y_c; 0, s^2 K + \mathrm{diag}(\tilde\sigma^2_c))`;
        it compares kernel hyperparameters at a fixed ``alpha_epsilon`` (the targets change
        with ``alpha_epsilon``, so values for different alphas are not comparable).
        """
        self._check_fitted()
        if not self.is_random_feature:
            return float(self.gp.log_marginal_likelihood())
        n, c = self._train_size, self.num_classes_
        # log N(y; 0, s^2 A) = log N(y / s; 0, A) - N log s per class.
        correction = -0.5 * n * c * math.log(self.outputscale_)
        return float(self.gp.log_marginal_likelihood()) + correction

    # -------------------------------------------------------------- model selection
    def select_alpha(
        self,
        x: Any,
        labels: Any,
        alphas: Sequence[float] = ALPHA_GRID,
        lengthscales: Optional[Sequence[float]] = None,
        validation_fraction: float = 0.1,
        seed: int = 0,
        lengthscale_criterion: str = "validation",
        method: str = "mean_field",
        refit: bool = True,
    ) -> DirichletGPClassifier:
        """Choose ``alpha_epsilon`` (and the kernel lengthscale) on a validation split.

        Fresh candidate classifiers are fitted and scored by
        :func:`rfgp.classification.select_alpha` (this classifier is the template and is not
        touched while they run); then this classifier takes the winning ``alpha_epsilon`` and
        lengthscale (set on its kernel) and, with ``refit``, is fitted on all data. Without
        ``refit`` it must be fitted again before predicting.

        Args:
            x, labels: the data, as for :meth:`fit`.
            alphas, lengthscales, validation_fraction, seed, lengthscale_criterion, method:
                see :func:`rfgp.classification.select_alpha`.
            refit: refit on all data with the chosen values.

        Returns:
            ``self``; the scores are in ``selection_`` (a list of dicts with ``alpha_epsilon``,
            ``lengthscale``, ``mnll``, ``log_marginal_likelihood``, ``selected``).
        """
        refit = check_bool("refit", refit)
        best, rows = select_alpha(
            self, x, labels, alphas=alphas, lengthscales=lengthscales,
            validation_fraction=validation_fraction, seed=seed,
            lengthscale_criterion=lengthscale_criterion, method=method,
        )
        self.selection_ = rows
        self.alpha_epsilon = best.alpha_epsilon
        chosen = next(r for r in rows if r["selected"])
        if chosen["lengthscale"] is not None:
            base = base_kernel(self.kernel)
            base.lengthscale = torch.full_like(base.lengthscale, chosen["lengthscale"])
        if refit:
            self.fit(x, labels)
        return self

