"""A vector field and its Helmholtz parts: the bundled 200 hPa wind (``rfgp.datasets.load_wind``).

On a patch over the Indian Ocean and South Asia (10S-30N, 60E-150E, planar coordinates in units
of 1000 km), a GP with Helmholtz random features (a curl-free plus a divergence-free part,
each with its own lengthscale and outputscale, fitted by the evidence) learns the wind
``(u, v)`` from 75% of the grid points and predicts the rest. ``rfgp.helmholtz_components``
then splits the posterior into its curl-free (divergent) and divergence-free (rotational)
parts; the data set carries the reference split from spherical harmonics, and the script
prints the correlation of each part with it (after removing the patch mean, which a planar
decomposition cannot attribute).

Run: ``python examples/vector_field.py`` (about ten seconds on two cores).
``RFGP_EXAMPLES_FAST=1`` uses fewer features and optimiser iterations.
"""

import math
import os

import numpy as np
import torch

from rfgp import RandomFeatureGP, helmholtz_components
from rfgp.datasets import load_wind
from rfgp.kernels import HelmholtzFeatureKernel

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"
EARTH_RADIUS = 6.371  # 1000 km


def correlation(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    e, r = estimate - estimate.mean(0), reference - reference.mean(0)
    return float((e * r).sum() / (e.norm() * r.norm()))


def main() -> dict:
    wind = load_wind()
    rows = (wind.latitude >= -10) & (wind.latitude <= 30)
    cols = (wind.longitude >= 60) & (wind.longitude <= 150)
    lat, lon = np.meshgrid(wind.latitude[rows], wind.longitude[cols], indexing="ij")
    # Equirectangular projection about the patch centre; (u, v) are east and north already.
    x = np.stack([EARTH_RADIUS * math.cos(math.radians(lat.mean())) * np.radians(lon - lon.mean()),
                  EARTH_RADIUS * np.radians(lat - lat.mean())], axis=-1).reshape(-1, 2)

    def field(u, v):  # (points, 2) tensor of a (u, v) pair on the patch
        return torch.tensor(np.stack([u[np.ix_(rows, cols)], v[np.ix_(rows, cols)]], -1)
                            .reshape(-1, 2), dtype=torch.float64)

    x, y = torch.tensor(x), field(wind.u, wind.v)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    train, test = perm[: int(0.75 * len(perm))], perm[int(0.75 * len(perm)):]
    offset, scale = y[train].mean(0), y[train].std()  # the prior mean is zero: standardise

    kernel = HelmholtzFeatureKernel(100 if FAST else 400, input_dim=2, seed=0).double()
    kernel.curl_lengthscale, kernel.div_lengthscale = 3.0, 1.0  # starts: 3000 km, 1000 km
    gp = RandomFeatureGP(kernel, noise=0.01)
    gp.optimize_hyperparameters(x[train], (y[train] - offset) / scale,
                                num_iterations=2 if FAST else 4)

    mean = gp.predict(x[test]) * scale + offset
    parts = helmholtz_components(gp, x[test])  # posteriors of the two parts, (N, 2) each
    scores = {
        "RMSE (m/s)": float((mean - y[test]).pow(2).mean().sqrt()),
        "curl-free part vs divergent wind": correlation(
            parts["curl"].mean, field(wind.u_chi, wind.v_chi)[test]),
        "div-free part vs rotational wind": correlation(
            parts["div"].mean, field(wind.u_psi, wind.v_psi)[test]),
    }
    print(f"wind speed std on the test points: {float(y[test].std()):.2f} m/s")
    for name, value in scores.items():
        print(f"{name}: {value:.3f}")
    print(f"lengthscales (1000 km): curl-free {kernel.curl_lengthscale.item():.2f}, "
          f"div-free {kernel.div_lengthscale.item():.2f}")
    return scores


if __name__ == "__main__":
    main()
