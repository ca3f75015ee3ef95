"""GPyTorch's weight-space prediction strategy, for kernels with several outputs per input.

Internal: not part of the public API (see :mod:`rfgp.kernels`).
"""

from __future__ import annotations

from gpytorch.distributions import MultivariateNormal
from gpytorch.models import exact_prediction_strategies

__all__ = ["WeightSpacePredictionStrategy"]


class WeightSpacePredictionStrategy(exact_prediction_strategies.LinearPredictionStrategy):
    r"""GPyTorch's weight-space ``LinearPredictionStrategy``, also for ``p > 1`` outputs per input.

    With a multitask prior GPyTorch flattens the ``(N, p)`` training labels to the interleaved
    ``(N p)`` vector, but the weight-space cache would subtract the unflattened ``(N, p)`` prior
    mean; here the cache sees the flat (interleaved) prior mean instead. For single-output
    kernels it is exactly ``LinearPredictionStrategy``: with the training features
    :math:`\Phi` and noise :math:`S`, it caches :math:`L L^\top = I + \Phi^\top S^{-1}\Phi` and
    :math:`(I + \Phi^\top S^{-1}\Phi)^{-1}\Phi^\top S^{-1}(y - \mu)`, so a prediction at ``M``
    test points costs ``O(M D^2)``.

    Example:
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> kernel = FourierFeatureKernel(16, seed=0)
        >>> class GP(gpytorch.models.ExactGP):
        ...     def forward(self, x):
        ...         mean = torch.zeros(x.shape[:-1])
        ...         return gpytorch.distributions.MultivariateNormal(mean, kernel(x))
        >>> model = GP(torch.randn(20, 2), torch.randn(20),
        ...            gpytorch.likelihoods.GaussianLikelihood()).eval()
        >>> _ = model(torch.randn(3, 2))
        >>> type(model.prediction_strategy).__name__
        'WeightSpacePredictionStrategy'
    """

    def __init__(self, train_inputs, train_prior_dist, train_labels, likelihood):
        super().__init__(train_inputs, train_prior_dist, train_labels, likelihood)
        prior = self.train_prior_dist
        if prior.loc.shape != prior.mean.shape:
            self.train_prior_dist = MultivariateNormal(prior.loc, prior.lazy_covariance_matrix)
