r"""The exact Dirichlet GP: ``C`` independent GPs that share a kernel, one per class."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from rfgp._validation import check_int, check_positive, check_real
from rfgp.inference._fingerprint import Fingerprint
from rfgp.likelihoods import DirichletLikelihood

__all__ = ["DirichletExactGP"]


class DirichletExactGP(gpytorch.models.ExactGP):
    r"""A batch of ``C`` independent exact GPs, a shared kernel and a :class:`DirichletLikelihood`.

    The prior of class ``c`` is :math:`f_c \sim \mathcal{GP}(0, s^2 k)` (``s^2`` =
    ``outputscale``); the covariance is computed once and broadcast over the class batch. As a
    GPyTorch model it trains with ``ExactMarginalLogLikelihood`` and predicts in eval mode.

    :meth:`latent_moments` and :meth:`log_marginal_likelihood` give the pointwise posterior and
    the evidence by one ``N x N`` Cholesky per class (each class has its own noise),

    .. math::
        A_c = s^2 K + \mathrm{diag}(\tilde\sigma^2_c) = L_c L_c^\top, \quad
        \mu_c(x) = s^2 k_x^\top A_c^{-1} \tilde y_c, \quad
        v_c(x) = s^2 k(x, x) - s^4 \|L_c^{-1} k_x\|^2,

    factorised on first use and refactorised whenever the kernel's parameters or buffers, the
    likelihood's noise or the training data have changed since (never a stale answer). This is
    the exact path of :class:`rfgp.DirichletGPClassifier`.

    Args:
        train_x: ``(N, d)`` inputs.
        likelihood: a :class:`DirichletLikelihood` whose training labels are set.
        kernel: any GPyTorch kernel with an empty batch shape and one output per input.
        outputscale: the prior variance :math:`s^2 > 0` multiplying the kernel.
        jitter: initial jitter for a Cholesky that fails (``None``: GPyTorch's default).

    Example:
        >>> x = torch.linspace(0, 1, 6, dtype=torch.float64).unsqueeze(-1)
        >>> lik = DirichletLikelihood(2, labels=torch.tensor([0, 0, 0, 1, 1, 1]))
        >>> model = DirichletExactGP(x, lik, gpytorch.kernels.RBFKernel()).double().eval()
        >>> model(x + 0.05).mean.shape
        torch.Size([2, 6])
        >>> mean, var = model.latent_moments(x + 0.05)
        >>> mean.shape, var.shape
        (torch.Size([6, 2]), torch.Size([6, 2]))
    """

    def __init__(
        self,
        train_x: Tensor,
        likelihood: DirichletLikelihood,
        kernel: Kernel,
        outputscale: float = 1.0,
        jitter: Optional[float] = None,
    ) -> None:
        if not isinstance(likelihood, DirichletLikelihood):
            raise TypeError(
                f"likelihood must be a DirichletLikelihood, got {type(likelihood).__name__}"
            )
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
        if likelihood.train_targets is None:
            raise ValueError("likelihood has no training labels; call set_train_labels first")
        if likelihood.train_targets.shape[-1] != train_x.shape[-2]:
            raise ValueError(
                f"train_x must have {likelihood.train_targets.shape[-1]} rows (the number of "
                f"training labels), got {train_x.shape[-2]}"
            )
        super().__init__(train_x, likelihood.train_targets.to(train_x), likelihood)
        self.covar_module = kernel
        self.num_classes = likelihood.num_classes
        self.outputscale = check_positive("outputscale", outputscale)
        self.jitter = None if jitter is None else check_real("jitter", jitter, low=0.0)
        self._factor: Optional[Tuple[Tensor, Tensor]] = None
        self._factor_state: Optional[Fingerprint] = None

    def forward(self, x: Tensor) -> MultivariateNormal:
        covar = self.covar_module(x) * self.outputscale
        n = covar.shape[-1]
        covar = covar.expand(self.num_classes, n, n)
        mean = torch.zeros(self.num_classes, n, dtype=x.dtype, device=x.device)
        return MultivariateNormal(mean, covar)

    # -------------------------------------------------------------- closed-form posterior
    def _inputs_now(self) -> dict:
        return {"noise": self.likelihood.noise, "train_x": self.train_inputs[0],
                "train_targets": self.train_targets}

    def _cholesky(self) -> Tuple[Tensor, Tensor]:
        """``(L, A^{-1} y)`` for every class, ``(C, N, N)`` and ``(C, N)``, kept until an input
        of the fit changes."""
        if self._factor is not None and not self._factor_state.changes(self, self._inputs_now()):
            return self._factor
        x = self.train_inputs[0]
        targets = self.train_targets.to(x)  # [C, N]
        with torch.no_grad():
            k = self.covar_module(x).to_dense().to(x.dtype) * self.outputscale  # [N, N]
            a = k + torch.diag_embed(self.likelihood.noise.to(k))  # [C, N, N]
            chol = psd_safe_cholesky(a, jitter=self.jitter)
            weights = torch.cholesky_solve(targets.unsqueeze(-1), chol).squeeze(-1)
        self._factor = (chol, weights)
        self._factor_state = Fingerprint.of(self, self._inputs_now())
        return self._factor

    def latent_moments(self, x: Tensor, chunk_size: int = 2048) -> Tuple[Tensor, Tensor]:
        """Pointwise posterior mean and variance of the ``C`` latent functions at ``x``.

        Args:
            x: ``(M, d)`` inputs (``M = 0`` gives empty results).
            chunk_size: test rows per block (bounds the memory to ``C x N x chunk``).

        Returns:
            ``(mean, variance)``, each ``(M, C)`` (centred targets: add the likelihood's
            ``class_offsets`` to the mean for the class latents).
        """
        chunk_size = check_int("chunk_size", chunk_size)
        chol, weights = self._cholesky()
        train_x = self.train_inputs[0]
        means = [x.new_zeros(0, self.num_classes)]
        variances = [x.new_zeros(0, self.num_classes)]
        with torch.no_grad():
            for start in range(0, x.shape[0], chunk_size):
                xs = x[start:start + chunk_size]
                cross = self.covar_module(train_x, xs).to_dense().to(x.dtype)
                cross = cross * self.outputscale  # [N, M]
                prior = self.covar_module(xs, diag=True).to(x.dtype) * self.outputscale  # [M]
                means.append((weights @ cross).transpose(0, 1))
                v = torch.linalg.solve_triangular(
                    chol, cross.expand(chol.shape[0], *cross.shape), upper=False
                )  # [C, N, M]
                variances.append((prior - v.pow(2).sum(-2)).clamp_min(0.0).transpose(0, 1))
        return torch.cat(means), torch.cat(variances)

    def log_marginal_likelihood(self) -> Tensor:
        r"""Evidence of the transformed targets summed over the classes,
        :math:`\sum_c \log N(\tilde y_c; 0, s^2 K + \mathrm{diag}(\tilde\sigma^2_c))`."""
        chol, weights = self._cholesky()
        targets = self.train_targets.to(weights)
        quad = (targets * weights).sum()
        logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum()
        return -0.5 * (quad + logdet + targets.numel() * math.log(2 * math.pi))
