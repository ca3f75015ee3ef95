r"""The predictions of a fitted :class:`~rfgp.inference.RandomFeatureGP`, as methods the model
inherits: the posterior mean and standard deviation at query rows (in row chunks, from
tensors, numpy arrays or memory-maps), the posterior distribution, and posterior function
draws.

With :math:`B = \Phi^H S^{-1} \Phi + I` the posterior at a query :math:`x_*` is
:math:`\mu(x_*) = \mathrm{Re}\{\phi_*^\top B^{-1} \Phi^H S^{-1} y\}` and
:math:`\sigma^2(x_*) = \mathrm{Re}\{\phi_*^\top B^{-1} \overline{\phi_*}\}`; every query row
is independent of the others, so :meth:`Prediction.predict` computes them a chunk of rows at
a time (memory ``O(chunk * D)``), the same numbers as one call on all rows.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from rfgp._data import array_row_chunks
from rfgp._validation import check_bool, check_generator, check_int
from rfgp.inference._noise import column_noise
from rfgp.inference._paths import SamplePaths
from rfgp.inference._posterior import posterior_distribution, root_covariance
from rfgp.inference._prior_mean import add_mean_rows

__all__ = ["Prediction"]


class Prediction:
    """The prediction methods of :class:`~rfgp.inference.RandomFeatureGP` (a mixin: it holds
    no state of its own; it reads the model's fit through ``_current`` and ``_query``)."""

    def predict_from_features(self, phi: Tensor, variance_correction: Optional[Tensor] = None,
                              return_std: bool = False, observation_noise: bool = False):
        """Posterior mean (and standard deviation) at points whose features are ``phi``.

        Args:
            phi, variance_correction: as in :meth:`posterior_from_features`.
            return_std: also return the standard deviation (latent, or with
                ``observation_noise`` that of a new observation).
            observation_noise: as in :meth:`predict`.

        Returns:
            As :meth:`predict`; differentiable in ``phi``.
        """
        state = self._current("predict_from_features")
        noise = self._observation_noise(state, observation_noise, return_std)
        rows, variance_correction = self.feature_map.checked_rows(phi, variance_correction)
        if not return_std:
            with torch.set_grad_enabled(torch.is_grad_enabled() and rows.requires_grad):
                return state.layout.shape_output(add_mean_rows(
                    state.solver.predict_mean(rows), state.prior_mean,
                    state.layout.outputs_per_input))
        return self._mean_and_std(state, rows, variance_correction, noise)

    def _mean_and_std(self, state, rows: Tensor, variance_correction: Optional[Tensor],
                      noise: Optional[Tensor]):
        """Mean and standard deviation at checked feature ``rows``, with the model noise per
        target column ``noise`` added to each variance where given (checked by the caller)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and rows.requires_grad):
            with state.solver.observing(noise):
                mean, var, _ = state.solver.predict(rows, want_root=False)
            if variance_correction is not None:
                var = var + variance_correction.to(var).reshape(-1).unsqueeze(-1)
            if noise is not None:
                var = var + noise.to(var)
            mean = add_mean_rows(mean, state.prior_mean, state.layout.outputs_per_input)
            return state.layout.shape_output(mean), state.layout.shape_output(var).sqrt()

    def posterior_from_features(self, phi: Tensor, variance_correction: Optional[Tensor] = None):
        r"""The posterior at points whose features are ``phi``.

        Args:
            phi: ``(M, D)`` (or ``(M, p, D)``) features in the layout and scale of the base
                kernel's ``features(x)`` (the ``ScaleKernel`` outputscale is applied here).
            variance_correction: optional ``(M,)`` (or ``(M p,)``) added to the variance.

        Returns:
            ``MultivariateNormal`` over ``M`` points, or a ``MultitaskMultivariateNormal`` for
            several outputs (interleaved rows); differentiable in ``phi``. The covariance is a
            lazy low-rank operator :math:`\mathrm{Re}\{\Phi_* B^{-1} \Phi_*^H\}`.
        """
        state = self._current("posterior_from_features")
        rows, variance_correction = self.feature_map.checked_rows(phi, variance_correction)
        with torch.set_grad_enabled(torch.is_grad_enabled() and rows.requires_grad):
            mean, _, roots = state.solver.predict(rows, want_root=True)
        covs = [root_covariance(root, variance_correction, mean) for root in roots]
        mean = add_mean_rows(mean, state.prior_mean, state.layout.outputs_per_input)
        return posterior_distribution(mean, covs, state.solver.groups(), state.layout)

    def posterior(self, x: Tensor):
        """The latent posterior (without noise) at ``x``; see :meth:`posterior_from_features`.

        Differentiable with respect to ``x`` when ``x.requires_grad``.

        Args:
            x: ``(M, d)`` test inputs (cast to the fit's dtype).

        Returns:
            ``MultivariateNormal`` (mean ``(M,)``) or ``MultitaskMultivariateNormal``.
        """
        self._current("posterior")
        x = self._query(x)
        with torch.set_grad_enabled(torch.is_grad_enabled() and x.requires_grad):
            phi = self.base_kernel.features(x)
            corr = self.feature_map.variance_correction(x) if self.correct_variance else None
        return self.posterior_from_features(phi, corr)

    def predict(self, x: Any, return_std: bool = False, chunk_size: Optional[int] = None,
                observation_noise: bool = False):
        r"""Posterior mean (and standard deviation) at ``x``, computed in row chunks.

        Differentiable with respect to ``x`` when ``x.requires_grad``. A query in another
        dtype is cast to the fit's dtype; ``M = 0`` rows give empty results. A numpy array
        or memory-map (``np.load(path, mmap_mode="r")``) is read ``chunk_size`` rows at a
        time and never converted whole: memory ``O(chunk * D)`` beside the ``M`` results,
        which equal those of the call on the rows as one tensor.

        Args:
            x: ``(M, d)`` test inputs: a tensor, or a float32 / float64 numpy array.
            return_std: also return the latent posterior standard deviation.
            chunk_size: rows per chunk.
            observation_noise: with ``return_std``, the standard deviation of a new
                observation, :math:`\sqrt{\sigma^2(x) + s}` with the model noise :math:`s`
                of each output (not for a fit with fixed noise variances, which say nothing
                of new points). ``solve="cg"`` holds each such variance within
                ``cg_variance_tolerance`` of :math:`\sigma^2 + s`, not of
                :math:`\sigma^2`: where the noise dominates, far cheaper.

        Returns:
            ``mean`` of shape ``(M,)``, ``(M, T)`` or ``(M, p)``; with ``return_std`` also
            ``std`` of the same shape (tensors, in the fit's dtype).

        Raises:
            TypeError: for an array of another dtype; ValueError: for a NaN or infinite
                query (an array's names its row).

        Example:
            >>> from rfgp import RandomFeatureGP
            >>> from rfgp.kernels import FourierFeatureKernel
            >>> x = torch.rand(100, 2, dtype=torch.float64)
            >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=0.1)
            >>> gp = gp.fit(x, x.sum(-1))
            >>> queries = np.random.default_rng(0).random((10, 2))  # or a memory-map
            >>> whole = gp.predict(torch.from_numpy(queries))
            >>> torch.allclose(gp.predict(queries, chunk_size=3), whole, rtol=1e-12, atol=0)
            True
        """
        state = self._current("predict")
        entries = state.solver.variance_chunk_entries if return_std else None
        step = self._check_chunk_size(chunk_size) or (
            self._factory.default_chunk(entries) if entries else self._factory.default_chunk())
        noise = self._observation_noise(state, observation_noise, return_std)  # checked once
        parts = []
        shape = getattr(x, "shape", ())
        # The solver may weigh a cost paid once (a dense factor of B) against all the rows.
        rows = int(shape[0]) * self.feature_map.outputs_per_input if len(shape) else 0
        with state.solver.expecting(rows if return_std else 0):
            for xs in self._query_chunks(x, step):
                with torch.set_grad_enabled(torch.is_grad_enabled() and xs.requires_grad):
                    features = self.base_kernel.features(xs)
                    if not return_std:  # a mean costs no variance (on solve="cg", no CG)
                        parts.append(self.predict_from_features(features))
                        continue
                    corr = (self.feature_map.variance_correction(xs) if self.correct_variance
                            else None)
                    feats, corr = self.feature_map.checked_rows(features, corr)
                    parts.append(self._mean_and_std(state, feats, corr, noise))
        if not return_std:
            return torch.cat(parts)
        return torch.cat([m for m, _ in parts]), torch.cat([s for _, s in parts])

    def _observation_noise(self, state, observation_noise: Any,
                           return_std: bool) -> Optional[Tensor]:
        """The model noise per target column ``(T,)`` that ``observation_noise=True`` adds to
        the variances (the values the posterior was computed with), or ``None``."""
        if not check_bool("observation_noise", observation_noise):
            return None
        if not return_std:
            raise ValueError(
                "observation_noise=True adds the noise variance to the standard deviation, "
                "which only return_std=True returns; got return_std=False"
            )
        if state.layout.fixed:
            raise ValueError(
                "observation_noise=True adds the model noise, but the GP was fitted with fixed "
                "noise variances (fit(x, y, noise)), which say nothing of new points"
            )
        noise = state.layout.frozen if state.layout.frozen is not None else self.noise
        return column_noise(noise.detach(), state.layout.num_columns)

    def _query_chunks(self, x: Any, step: int) -> Iterator[Tensor]:
        """``x``'s rows, ``step`` at a time, checked and cast to the fit's dtype: a tensor
        checked whole and sliced, an array read and checked chunk by chunk."""
        if isinstance(x, np.ndarray):
            for chunk in array_row_chunks(x, step, "x"):
                yield self._query(chunk)
            return
        x = self._query(x)
        for start in range(0, max(x.shape[0], 1), step):
            yield x[start : start + step]

    def sample_functions(self, num_samples: int,
                         generator: Optional[torch.Generator] = None) -> SamplePaths:
        r"""Posterior function draws in weight space, evaluable (and differentiable) anywhere.

        The weights are drawn once: :math:`w = \mu_w + L^{-H} z` with :math:`B = L L^H`, so
        :math:`f(x) = \mathrm{Re}\{\Phi(x)^\top w\}` has mean :math:`\mu(x)` and covariance
        :math:`\mathrm{Re}\,k_N(x, x')` (complex features: :math:`z = a + i b`). A real
        function-space fit draws the same distribution by pathwise conditioning,
        :math:`w = w_0 + \Phi^\top (K + S)^{-1}(y - \Phi w_0 - \epsilon)` with
        :math:`w_0 \sim N(0, I)`, :math:`\epsilon \sim N(0, S)`: no ``D x D`` matrix, so
        many features on few rows stay cheap to sample.

        Args:
            num_samples: number of functions ``S``.
            generator: ``torch.Generator`` for reproducible draws.

        Returns:
            A :class:`~rfgp.inference.SamplePaths` module: ``paths(x) -> (S, M)``
            (``(S, M, T)`` or ``(S, M, p)``). It owns a copy of the kernel, so it stays a draw
            of this posterior; it moves with ``.to()`` and saves with ``torch.save``.
        """
        num_samples = check_int("num_samples", num_samples)
        generator = check_generator("generator", generator)
        state = self._current("sample_functions")
        with torch.no_grad():
            draws = state.solver.draw_weights(num_samples, generator,
                                              self._column_noise(state.layout))
        return SamplePaths(self.kernel, draws, state.layout, self._complex_solve,
                           state.prior_mean)

