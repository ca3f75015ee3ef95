"""GPyTorch likelihoods of rfgp: the Dirichlet-transformed classification likelihood."""

from rfgp.inference.dirichlet import DirichletLikelihood

__all__ = ["DirichletLikelihood"]
