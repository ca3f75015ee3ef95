"""Inference with random-feature kernels: the weight-space GP solver."""

from rfgp.inference.feature_gp import RandomFeatureGP

__all__ = ["RandomFeatureGP"]
