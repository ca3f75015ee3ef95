r"""Closed-form variances of the polynomial sketches (real, complex and Complex-to-Real) of
:class:`~rfgp.kernels.PolynomialSketchKernel` and :class:`~rfgp.kernels.MaclaurinKernel`.

For a degree-:math:`p` sketch with :math:`D` features and the estimator
:math:`\hat k(x, y) = \Phi(x)^\top \overline{\Phi(y)}` of :math:`(x^\top y)^p`, every function
here returns the exact :math:`\mathbb{V}[\hat k(x, y)] = \mathbb{E}|\hat k - (x^\top y)^p|^2`
for row-wise pairs (``x`` and ``y`` broadcast, shape ``(..., d) -> (...)``), computed in float64.
Inputs are used as given: scale them and append the bias coordinate first.

Notation: :math:`s = x^\top y`, :math:`N = \|x\|^2\|y\|^2`, :math:`S = \sum_k x_k^2 y_k^2`,
:math:`a = s^2 - S = \sum_{t \ne u} x_t y_t x_u y_u`.

* Unstructured sketches with i.i.d. weight entries :math:`z = u + i v`,
  :math:`\mathbb{E}|z|^2 = 1`, :math:`\mathbb{E}|z|^4 = m_4`, :math:`\mathbb{E}u^2 = q`
  (Theorem 2 of Wacker, Kanagawa & Filippone 2022):

  .. math::
      \mathbb{V} = \tfrac1D\big[(m_4 S + N - S + ((2q-1)^2 + 1)\,a)^p - s^{2p}\big],

  real Gaussian :math:`(m_4, q) = (3, 1)`, real Rademacher :math:`(1, 1)`, complex Gaussian
  :math:`(2, \tfrac12)`, complex Rademacher :math:`(1, \tfrac12)`. The pseudo-variance
  :math:`\mathrm{PV} = \mathbb{E}[(\hat k - s^p)^2]` is
  :math:`\tfrac1D[(m_4 S + 2a + (2q-1)^2 (N - S))^p - s^{2p}]`.
* TensorSRHT with independent signs and permutations for every degree and block (Theorems 5/10),
  padded dimension :math:`d'` and :math:`c(D, d') = \lfloor D/d' \rfloor d'(d'-1) + r(r-1)`,
  :math:`r = D \bmod d'` ordered pairs of features in the same block:

  .. math::
      \mathbb{V} = \tfrac1D V^{(p)} + \tfrac{c(D, d')}{D^2}
          \big[(s^2 - V^{(1)}/(d'-1))^p - s^{2p}\big],

  with :math:`V^{(p)}` the single-feature Rademacher-type variance above and
  :math:`V^{(1)} = N - S + (2q-1)^2 a` its degree-1 value; the pseudo-variance replaces
  :math:`V^{(1)}` by :math:`\mathrm{PV}^{(1)} = a + (2q-1)^2 (N - S)`.
* TensorSketch (count sketches of size :math:`D`, convolved by the FFT; derived here, not in the
  papers). With :math:`T_0 = s^{2p}`, :math:`T_B = (N + a)^p`, :math:`T_C = (s^2 + a)^p`,
  :math:`T = (N + 2a)^p` and :math:`g = \gcd(2, D)`, real signs give

  .. math::
      \mathbb{V} = \tfrac1D (T_B + T_C - 2 T_0) + \tfrac{g}{D^2}(T - T_B - T_C + T_0),

  and complex signs :math:`\{\pm1, \pm i\}` give :math:`\mathbb{V} = (T_B - T_0)/D` and
  :math:`\mathrm{PV} = (T_C - T_0)/D` -- the complex Rademacher values.
  (Per degree, the fourth sign moments pair indices as ``t = u`` (weight :math:`s^2`),
  ``t = t', u = u'`` (weight :math:`N - S`) or ``t = u', u = t'`` (weight :math:`a`); the two
  hash-collision events of the last two patterns hold with probability :math:`1/D` each, or
  :math:`g/D^2` jointly.)
* Complex-to-Real (real part of a complex sketch, features :math:`[\mathrm{Re}\,\Phi,
  \mathrm{Im}\,\Phi]`): :math:`\mathbb{V}[\mathrm{Re}\,\hat k] = \tfrac12(\mathbb{V} +
  \mathrm{PV})`.

All formulas are checked against Monte Carlo in the test suite.

Example:
    >>> import torch
    >>> from rfgp.variance import sketch_variance
    >>> x = torch.ones(1, 4, dtype=torch.float64) / 2
    >>> float(sketch_variance(x, x, 1, 4, "tensorsrht"))   # degree 1, D = d: exact
    0.0

References:
    Wacker, Kanagawa & Filippone, *Improved Random Features for Dot Product Kernels*, 2022
    (Theorems 2, 5, 10; Table 1).
    Wacker, Ohana & Filippone, *Complex-to-Real Random Features for Polynomial Kernels*, 2022
    (Eq. 6: variance of the real part).
"""

from rfgp.kernels._maclaurin.variance import (
    gaussian_sketch_variance,
    pair_moments,
    rademacher_sketch_variance,
    sketch_variance,
    srht_pair_count,
    tensorsketch_variance,
    tensorsrht_variance,
    tensorsrht_variance_terms,
    unstructured_pseudo_variance,
    unstructured_variance,
)

__all__ = [
    "pair_moments",
    "srht_pair_count",
    "unstructured_variance",
    "unstructured_pseudo_variance",
    "gaussian_sketch_variance",
    "rademacher_sketch_variance",
    "tensorsrht_variance",
    "tensorsrht_variance_terms",
    "tensorsketch_variance",
    "sketch_variance",
]
