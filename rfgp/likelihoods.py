r"""GPyTorch likelihoods of rfgp: the Dirichlet transform of class labels (Milios et al., 2018).

Classification with :math:`C` classes becomes :math:`C` independent GP regressions with known
heteroscedastic noise. A one-hot label :math:`y_{n} \in \{0, 1\}^C` defines Dirichlet
concentrations :math:`\alpha_{n,c} = y_{n,c} + \alpha_\epsilon`; each Gamma variable of the
Dirichlet is moment-matched by a log-normal, which gives the regression targets and noise

.. math::
    \tilde\sigma^2_{n,c} = \log(1 / \alpha_{n,c} + 1), \qquad
    \tilde y_{n,c} = \log \alpha_{n,c} - \tilde\sigma^2_{n,c} / 2,

so that :math:`\exp(\tilde y + \tilde\sigma^2 / 2) = \alpha` (mean) and
:math:`(e^{\tilde\sigma^2} - 1) e^{2 \tilde y + \tilde\sigma^2} = \alpha` (variance).

* :func:`validate_labels`: integer class indices in ``[0, C)``.
* :func:`dirichlet_transform`: the targets and noise above, ``(N, C)``.
* :class:`DirichletLikelihood`: the transform as a GPyTorch ``FixedNoiseGaussianLikelihood``.

The classifier built on it lives in :mod:`rfgp.classification`; the softmax approximations in
:func:`rfgp.classification.softmax_expectation`.

References:
    D. Milios, R. Camoriano, P. Michiardi, L. Rosasco, M. Filippone. Dirichlet-based Gaussian
    processes for large-scale calibrated classification. NeurIPS 2018.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
from torch import Tensor

from rfgp._softmax import latent_moments, softmax_expectation
from rfgp._validation import (
    check_bool,
    check_dtype,
    check_int,
    check_long_tensor,
    check_positive,
)

__all__ = ["DirichletLikelihood", "check_alpha_epsilon", "dirichlet_transform", "validate_labels"]


def validate_labels(
    labels: Any,
    num_classes: Optional[int] = None,
    require_two_classes: bool = True,
    name: str = "labels",
) -> Tuple[Tensor, int]:
    """Check class *indices* and return them as a ``torch.long`` tensor with the class count.

    The labels are indices into ``C`` classes. Arbitrary class ids (``{3, 10**6}``, negative
    ids) are the classifier's business: :class:`rfgp.DirichletGPClassifier` maps them to
    indices as scikit-learn does (``classes_``), never through a dense range up to the largest id.

    Args:
        labels: ``(N,)`` integer class indices in ``[0, num_classes)`` (a tensor or a NumPy
            array of an integer dtype; floats and booleans are refused, not rounded).
        num_classes: ``C``; ``None`` infers ``max(labels) + 1``.
        require_two_classes: refuse labels in which fewer than two distinct classes occur.
        name: the argument name used in error messages.

    Returns:
        ``(labels, num_classes)``: ``(N,)`` long tensor and ``C``.

    Raises:
        TypeError: non-tensor input or a non-integer dtype.
        ValueError: wrong shape, empty, negative, ``>= num_classes``, or a single class.

    Example:
        >>> validate_labels(torch.tensor([0, 2, 1]))
        (tensor([0, 2, 1]), 3)
    """
    labels = check_long_tensor(name, labels, "integer class indices")
    if labels.dim() != 1:
        raise ValueError(
            f"{name} must be a 1-D tensor of shape (N,), got shape {tuple(labels.shape)}"
        )
    if labels.numel() == 0:
        raise ValueError(f"{name} must not be empty")
    low = int(labels.min())
    if low < 0:
        raise ValueError(f"{name} must be non-negative class indices, got minimum {low}")
    high = int(labels.max())
    if num_classes is None:
        num_classes = high + 1
        if num_classes < 2:
            raise ValueError(
                f"{name} hold a single class ({high}); pass num_classes or at least two classes"
            )
    else:
        num_classes = check_int("num_classes", num_classes, minimum=2)
        if high >= num_classes:
            raise ValueError(
                f"{name} must be < num_classes = {num_classes}, got maximum {high}"
            )
    if require_two_classes and labels.unique().numel() < 2:
        raise ValueError(
            f"{name} must contain at least two distinct classes, got only class {low}"
        )
    return labels, num_classes


def _transform(
    labels: Tensor, num_classes: int, alpha_epsilon: float, dtype: torch.dtype
) -> Tuple[Tensor, Tensor]:
    # The closed form for labels validate_labels returned (long, in range) and a checked alpha.
    alpha = torch.nn.functional.one_hot(labels, num_classes).to(dtype) + alpha_epsilon  # [N, C]
    noise = torch.log1p(1.0 / alpha)
    targets = torch.log(alpha) - noise / 2
    return targets, noise


def _alpha_usable(alpha_epsilon: Tensor, dtype: torch.dtype) -> Tensor:
    """Whether each ``alpha_epsilon`` gives finite targets and noise in ``dtype`` and a target
    of the labelled class above that of the others (they are equal once ``1 + alpha`` rounds
    to ``alpha``, and ``1 / alpha`` overflows for the smallest values)."""
    alpha = alpha_epsilon.to(dtype)
    noise_off, noise_on = torch.log1p(1 / alpha), torch.log1p(1 / (1 + alpha))
    off = torch.log(alpha) - noise_off / 2
    on = torch.log1p(alpha) - noise_on / 2
    finite = torch.isfinite(off) & torch.isfinite(on) & torch.isfinite(noise_off)
    return finite & (on > off) & (noise_on > 0)


def check_alpha_epsilon(alpha_epsilon: Any, dtype: torch.dtype) -> float:
    """Return ``alpha_epsilon`` as a float if the transform in ``dtype`` can use it.

    It must be a positive real number for which the transformed targets and noise are finite
    and the labelled class's target exceeds the others' in ``dtype``: about ``[1e-308, 3e14]``
    in float64 and ``[6e-39, 8e6]`` in float32 (the message gives the powers of two that pass).

    Example:
        >>> check_alpha_epsilon(0.01, torch.float64)
        0.01
        >>> check_alpha_epsilon(1e300, torch.float64)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: alpha_epsilon must lie in about [...] for torch.float64 targets ..., got 1e+300
    """
    alpha_epsilon = check_positive("alpha_epsilon", alpha_epsilon)
    if bool(_alpha_usable(torch.tensor(alpha_epsilon, dtype=torch.float64), dtype)):
        return alpha_epsilon
    # The usable powers of two, for the message.
    powers = torch.ldexp(torch.ones(2100, dtype=torch.float64),
                         torch.arange(-1074, 1026, dtype=torch.int64))
    usable = powers[_alpha_usable(powers, dtype)]
    low, high = float(usable.min()), float(usable.max())
    raise ValueError(
        f"alpha_epsilon must lie in about [{low:.3g}, {high:.3g}] for {dtype} targets (where "
        "the transformed targets and noise are finite and the labelled class's target exceeds "
        f"the others'), got {alpha_epsilon!r}"
    )


def dirichlet_transform(
    labels: Any,
    num_classes: int,
    alpha_epsilon: float = 0.01,
    dtype: Union[torch.dtype, str] = torch.float64,
) -> Tuple[Tensor, Tensor]:
    r"""Milios et al.'s regression targets and heteroscedastic noise for class labels.

    .. math::
        \alpha_{n,c} = \alpha_\epsilon + [y_n = c], \quad
        \tilde\sigma^2_{n,c} = \log(1/\alpha_{n,c} + 1), \quad
        \tilde y_{n,c} = \log\alpha_{n,c} - \tilde\sigma^2_{n,c}/2.

    Args:
        labels: ``(N,)`` integer labels in ``[0, num_classes)`` (validated; a class may be absent).
        num_classes: ``C >= 2``.
        alpha_epsilon: the concentration added to every class, ``> 0``, in the range of
            :func:`check_alpha_epsilon` for ``dtype``.
        dtype: floating dtype of the outputs (a ``torch.dtype`` or its name, ``"float32"``).

    Returns:
        ``(targets, noise)``, both ``(N, C)`` (one column per class).

    Example:
        >>> import math
        >>> y, s2 = dirichlet_transform(torch.tensor([0, 1]), 2, alpha_epsilon=1.0)
        >>> torch.allclose(s2[0], torch.tensor([math.log(1.5), math.log(2.0)], dtype=s2.dtype))
        True
    """
    num_classes = check_int("num_classes", num_classes, minimum=2)
    labels, num_classes = validate_labels(labels, num_classes, require_two_classes=False)
    dtype = check_dtype("dtype", dtype)
    alpha_epsilon = check_alpha_epsilon(alpha_epsilon, dtype)
    return _transform(labels, num_classes, alpha_epsilon, dtype)


class DirichletLikelihood(FixedNoiseGaussianLikelihood):
    r"""GPyTorch likelihood of the Dirichlet-transformed classification targets (Milios et al.).

    For training labels :math:`y_n` the likelihood is Gaussian with fixed heteroscedastic noise
    :math:`\tilde\sigma^2_{n,c} = \log(1/\alpha_{n,c} + 1)` on the transformed targets
    :math:`\tilde y_{n,c} = \log\alpha_{n,c} - \tilde\sigma^2_{n,c}/2`,
    :math:`\alpha_{n,c} = \alpha_\epsilon + [y_n = c]`, independently for each class. It is a
    ``FixedNoiseGaussianLikelihood`` whose ``(C, N)`` noise is set by :meth:`set_train_labels`,
    used with a batch of ``C`` independent GPs (an ``ExactGP`` whose prior has batch shape
    ``(C,)``, see :class:`rfgp.classification.DirichletExactGP`) or, through
    :meth:`transform_labels`, with :class:`rfgp.RandomFeatureGP`.

    Differences from GPyTorch's ``DirichletClassificationLikelihood``: ``num_classes`` is explicit,
    so a class absent from the training labels keeps its GP (it is fitted to the all-negative
    target); labels are validated; the targets are optionally centred per class
    (``centre=True``, the offset is added back in :meth:`class_probabilities`).

    Args:
        num_classes: ``C >= 2``.
        alpha_epsilon: the concentration added to every class (the papers' grid is
            :data:`rfgp.classification.ALPHA_GRID`); smaller values give sharper fits.
        centre: subtract the per-class mean of the transformed targets before fitting (the
            papers' code does this; a zero-mean GP then sits at the average target instead of 0).
            Set it to ``False`` when the GP has its own (e.g. constant) mean.
        labels: optional training labels, passed to :meth:`set_train_labels`.

    Attributes:
        train_targets: ``(C, N)`` the (centred) targets for the ``ExactGP``, after
            :meth:`set_train_labels`.
        class_offsets: ``(C,)`` the per-class means removed by centring (zeros without it).
        noise: ``(C, N)`` the fixed noise variances.

    Example:
        >>> lik = DirichletLikelihood(num_classes=3, alpha_epsilon=0.1, centre=False)
        >>> targets = lik.set_train_labels(torch.tensor([0, 2, 2]))
        >>> targets.shape, lik.noise.shape
        (torch.Size([3, 3]), torch.Size([3, 3]))
    """

    def __init__(
        self,
        num_classes: int,
        alpha_epsilon: float = 0.01,
        centre: bool = True,
        labels: Optional[Tensor] = None,
    ) -> None:
        num_classes = check_int("num_classes", num_classes, minimum=2)
        alpha_epsilon = check_positive("alpha_epsilon", alpha_epsilon)
        centre = check_bool("centre", centre)
        # No training labels yet: a (C, 0) noise that marginal() refuses with a clear message.
        super().__init__(noise=torch.zeros(num_classes, 0, dtype=torch.float64))
        self.num_classes = num_classes
        self.alpha_epsilon = alpha_epsilon
        self.centre = centre
        self.register_buffer("class_offsets", torch.zeros(num_classes, dtype=torch.float64))
        self.train_targets: Optional[Tensor] = None
        if labels is not None:
            self.set_train_labels(labels)

    # -------------------------------------------------------------- targets
    def transform_labels(
        self, labels: Any, dtype: Union[torch.dtype, str] = torch.float64
    ) -> Tuple[Tensor, Tensor]:
        """Transformed targets and noise of ``labels`` in the batch layout, without centring.

        Args:
            labels: ``(N,)`` integer labels in ``[0, num_classes)``.
            dtype: floating dtype of the outputs.

        Returns:
            ``(targets, noise)``, both ``(C, N)``: row ``c`` is the regression problem of class
            ``c`` (transpose them for :class:`rfgp.RandomFeatureGP`, which takes ``(N, C)``).
        """
        targets, noise = dirichlet_transform(labels, self.num_classes, self.alpha_epsilon, dtype)
        return targets.transpose(0, 1).contiguous(), noise.transpose(0, 1).contiguous()

    def set_train_labels(
        self, labels: Any, dtype: Union[torch.dtype, str] = torch.float64
    ) -> Tensor:
        """Fix the training labels: store the noise and offsets, return the ``(C, N)`` targets.

        Args:
            labels: ``(N,)`` integer labels; at least two distinct classes must occur.
            dtype: floating dtype of the targets and noise.

        Returns:
            ``(C, N)`` targets (centred when ``centre``) to pass to the ``ExactGP`` as its
            ``train_targets``.
        """
        validate_labels(labels, self.num_classes, require_two_classes=True)
        targets, noise = self.transform_labels(labels, dtype)
        if self.centre:
            offsets = targets.mean(dim=-1)
            targets = targets - offsets.unsqueeze(-1)
        else:
            offsets = torch.zeros(self.num_classes, dtype=targets.dtype)
        device = self.class_offsets.device
        self.class_offsets = offsets.to(device=device)
        self.noise = noise.to(device=device)
        self.train_targets = targets.to(device=device)
        return self.train_targets

    # -------------------------------------------------------------- GPyTorch likelihood
    def _check_points(self, function_dist: Any, kwargs: dict) -> None:
        if kwargs.get("noise") is not None or not isinstance(function_dist, MultivariateNormal):
            return
        known = self.noise.shape[-1]
        if known == 0:
            raise RuntimeError(
                "DirichletLikelihood: no training labels; call set_train_labels(labels) first"
            )
        points = function_dist.event_shape[-1]
        if points != known:
            raise ValueError(
                f"DirichletLikelihood: the noise is known for the {known} training points only, "
                f"got {points} points; use class_probabilities(latent) to predict"
            )

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any):
        r"""The marginal :math:`p(\tilde y) = N(\mu, K + \mathrm{diag}(\tilde\sigma^2))` at the
        training points (pass ``noise=`` for other points)."""
        self._check_points(function_dist, kwargs)
        return super().marginal(function_dist, *args, **kwargs)

    def expected_log_prob(self, observations: Tensor, function_dist: MultivariateNormal,
                          *args: Any, **kwargs: Any) -> Tensor:
        """GPyTorch's expected log likelihood, at the training points (or with ``noise=``)."""
        self._check_points(function_dist, kwargs)
        return super().expected_log_prob(observations, function_dist, *args, **kwargs)

    # -------------------------------------------------------------- prediction
    def class_probabilities(
        self,
        latent: Any,
        method: str = "mc",
        num_samples: int = 1000,
        generator: Optional[torch.Generator] = None,
        log: bool = False,
    ) -> Tensor:
        """Class probabilities ``E[softmax(f + class_offsets)]`` from the latent posterior.

        Args:
            latent: the posterior of the (centred) latent GPs at ``M`` points: a gpytorch
                ``MultivariateNormal`` with batch shape ``(C,)`` (an ``ExactGP`` in eval mode),
                a ``MultitaskMultivariateNormal`` ``(M, C)`` (:class:`rfgp.RandomFeatureGP`), a
                ``torch.distributions.Normal`` or a ``(mean, variance)`` pair of shape ``(M, C)``.
            method, num_samples, generator, log: see
                :func:`rfgp.classification.softmax_expectation`.

        Returns:
            ``(M, C)`` probabilities (log-probabilities with ``log=True``).
        """
        mean, variance = latent_moments(latent)
        if mean.shape[-1] != self.num_classes:
            raise ValueError(
                f"latent must have {self.num_classes} classes, got mean of shape "
                f"{tuple(mean.shape)}"
            )
        mean = mean + self.class_offsets.to(mean)
        return softmax_expectation(
            mean, variance, method, num_samples, generator=generator, log=log
        )
