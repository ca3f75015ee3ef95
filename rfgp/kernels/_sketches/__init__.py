r"""Random sketches of the polynomial kernel: Gaussian, Rademacher, TensorSketch, TensorSRHT.

A degree-:math:`p` polynomial sketch is a random map :math:`\Phi: \mathbb{R}^d \to
\mathbb{R}^D` (or :math:`\mathbb{C}^D`) with

.. math::
    \mathbb{E}\big[\Phi(x)^\top \overline{\Phi(y)}\big] = (x^\top y)^p .

Four constructions, each real or complex:

* ``"gaussian"`` / ``"rademacher"`` (unstructured, Kar & Karnick 2012; complex version Wacker
  et al. 2022): :math:`\Phi(x)_l = D^{-1/2} \prod_{i=1}^p w_{i,l}^\top x` with i.i.d. weight
  vectors. Real: entries :math:`N(0, 1)` or uniform on :math:`\{1, -1\}`. Complex: entries
  :math:`(v + i w)/\sqrt2` with :math:`v, w \sim N(0, 1)`, or uniform on :math:`\{1, -1, i, -i\}`.
  Cost :math:`O(p d D)` per input (one GEMM).
* ``"tensorsketch"`` (Pham & Pagh 2013): one CountSketch :math:`C_i x` per degree (hash
  :math:`h_i: [d] \to [D]`, signs :math:`s_i` uniform on :math:`\{1, -1\}`, or on
  :math:`\{1, -1, i, -i\}` for the complex version), combined by circular convolution through
  the FFT: :math:`\Phi(x) = \mathrm{IFFT}(\prod_i \mathrm{FFT}(C_i x))`. Cost
  :math:`O(p (d + D \log D))`. The complex version is supported and unbiased, but its variance
  equals that of the complex Rademacher sketch (see :mod:`rfgp.variance`), so its CtR form brings
  no gain over real TensorSketch at equal output size -- as Wacker, Ohana & Filippone report.
* ``"tensorsrht"`` (Algorithm 1 of Wacker, Kanagawa & Filippone 2022): inputs are zero-padded to
  :math:`d' = 2^k`; for every block :math:`b = 1..\lceil D/d' \rceil` and every degree
  :math:`i`, independent random signs :math:`D_{b,i}` (real :math:`\{\pm 1\}` or complex
  :math:`\{\pm 1, \pm i\}`) and an independent random permutation :math:`\pi_{b,i}` give the
  projections :math:`P_{\pi_{b,i}} H_{d'} D_{b,i} x` (unnormalised Walsh--Hadamard
  :math:`H`); the block's features are their elementwise product over :math:`i`, the blocks
  are concatenated, truncated to :math:`D` and scaled by :math:`D^{-1/2}`. Cost
  :math:`O(p D \log d')`. On the CPU with numba installed (the ``fast`` extra), compiled fast
  Walsh--Hadamard kernels compute the features and, in training, their gradients with
  respect to the inputs, lengthscale and bias (:mod:`rfgp.kernels._sketches._srht_numba`;
  ``RFGP_DISABLE_NUMBA=1`` switches them off); otherwise (no numba: warned once, or on a GPU)
  the transforms are two Kronecker-factored GEMMs per chunk. Both give the same features for
  the same weights. Projections inside one block are
  orthogonal, which lowers the variance (exactly zero for ``degree = 1`` and ``D`` a multiple
  of :math:`d'`).

Complex features and the Complex-to-Real (CtR) map: ``D`` complex features give the ``2D`` real
columns :math:`[\mathrm{Re}\,\Phi, \mathrm{Im}\,\Phi]` whose Gram matrix is exactly
:math:`\mathrm{Re}(\Phi \Phi^H)`, an unbiased estimate with variance
:math:`\tfrac12(\mathbb{V} + \mathrm{PV})` of the complex sketch. At a fixed *real* output
size ``R`` use ``R / 2`` complex features (:meth:`PolynomialSketchKernel.ctr`).

References:
    Kar & Karnick, *Random Feature Maps for Dot Product Kernels*, AISTATS 2012.
    Pham & Pagh, *Fast and Scalable Polynomial Kernels via Explicit Feature Maps*, KDD 2013.
    Ahle et al., *Oblivious Sketching of High-Degree Polynomial Kernels*, SODA 2020.
    Wacker, Kanagawa & Filippone, *Improved Random Features for Dot Product Kernels*, 2022.
    Wacker, Ohana & Filippone, *Complex-to-Real Random Features for Polynomial Kernels*, 2022.
"""

from rfgp.kernels._sketches.apply import apply_sketch
from rfgp.kernels._sketches.polynomial import PolynomialSketchKernel
from rfgp.kernels._sketches.sampling import PROJECTIONS, sample_sketch

__all__ = ["PROJECTIONS", "PolynomialSketchKernel", "sample_sketch", "apply_sketch"]
