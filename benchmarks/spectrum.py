"""The scale calibration's spectrum: eigenvalues of a Gram matrix and the targets' weights on
its eigenvectors, through the tridiagonal form against a dense eigendecomposition, in units
of the same machine's ``D x D`` matrix product.

``spectrum_weights`` (``rfgp/inference/_spectrum.py``) reduces ``G = Phi^T Phi`` to
tridiagonal form, applies the reflectors to the targets' column and takes the tridiagonal
matrix's eigenvectors, never forming ``G``'s; the dense route is ``torch.linalg.eigh`` with
eigenvectors and their products with the column. ``G`` is the Gram matrix of ``D`` random
Fourier features on ``2 D`` rows of 9 Gaussian inputs (a spectrum that decays as the
calibration's do). Agreement: the eigenvalues' largest difference over the largest, and
each route's ``sum_i p_i / (lambda_i + c)`` against a Cholesky solve of
``b^T (G + c I)^-1 b`` at ``c = 1e-4 lambda_max``.

Usage::

    python benchmarks/spectrum.py            # about four minutes on two cores
    python benchmarks/spectrum.py --quick    # seconds, into a temporary folder

Writes docs/benchmarks/spectrum.md (its hand-written reading kept) and .jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _pages import best_of, write_page  # noqa: E402

from rfgp.inference._feature_map import FeatureMap  # noqa: E402
from rfgp.inference._spectrum import spectrum_weights  # noqa: E402
from rfgp.kernels import FourierFeatureKernel  # noqa: E402

DT = torch.float64


def gram_of(width: int) -> tuple:
    """``(G, b)``: the Gram matrix of ``width`` random Fourier features on ``2 width`` rows
    of 9 inputs and the features' product with a random target."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * width, 9, generator=g, dtype=DT)
    kernel = FourierFeatureKernel(width, seed=0).double()
    with torch.no_grad():
        phi = FeatureMap(kernel).real_rows(x)
    y = torch.randn(2 * width, 1, generator=g, dtype=DT)
    return phi.T @ phi, phi.T @ y


def dense_route(gram: torch.Tensor, b: torch.Tensor) -> tuple:
    """Eigenvalues and weights by a dense eigendecomposition with eigenvectors."""
    eigenvalues, vectors = torch.linalg.eigh(gram)
    return eigenvalues, (vectors.T @ b).square().sum(-1)


def resolvent_error(eigenvalues, weights, gram, b, shift) -> float:
    """Relative error of ``sum p / (lambda + c)`` against the solve of ``G + c I``."""
    factor = torch.linalg.cholesky(gram + shift * torch.eye(gram.shape[0], dtype=DT))
    exact = float((b * torch.cholesky_solve(b, factor)).sum())
    return abs(float((weights / (eigenvalues + shift)).sum()) - exact) / exact


def measure(width: int, repeats: int) -> dict:
    gram, b = gram_of(width)
    t_product = best_of(lambda: gram @ gram, repeats)
    kept = []  # each route's answer, from its timed calls
    t_route = best_of(lambda: kept.append(spectrum_weights(gram, b)), repeats)
    lam, p = kept[-1]
    t_dense = best_of(lambda: kept.append(dense_route(gram, b)), repeats)
    dense_lam, dense_p = kept[-1]
    shift = 1e-4 * float(lam.max())
    record = {"width": width, "product_seconds": t_product, "seconds": t_route,
              "resolvent_error": resolvent_error(lam, p, gram, b, shift),
              "dense_seconds": t_dense,
              "dense_resolvent_error": resolvent_error(dense_lam, dense_p, gram, b, shift),
              "eigenvalue_difference": float((lam - dense_lam).abs().max() / lam.max())}
    print(record, flush=True)
    return record


def write_markdown(records: list, path: Path) -> None:
    lines = [
        "# The scale calibration's spectrum against the matrix-multiply speed",
        "",
        "Written by `benchmarks/spectrum.py` (module docstring: what is timed). "
        f"Machine: {platform.machine()}, {torch.get_num_threads()} threads, float64, "
        f"PyTorch {torch.__version__}. Seconds are the best of the repeats, nothing else "
        "running; `in products`: over the seconds of one `D x D` product timed in the same "
        "run. Errors: the eigenvalues' largest difference over the largest eigenvalue, and "
        "`sum p / (lambda + c)` against a Cholesky solve at `c = 1e-4 lambda_max`.",
        "",
        "| D | product (s) | tridiagonal (s) | in products | dense eigh (s) | in products | "
        "speed-up | eigenvalue difference | resolvent error (tridiagonal) | "
        "resolvent error (dense) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        unit = r["product_seconds"]
        lines.append(
            f"| {r['width']:,} | {unit:.3f} | {r['seconds']:.2f} | {r['seconds'] / unit:.1f} | "
            f"{r['dense_seconds']:.2f} | {r['dense_seconds'] / unit:.1f} | "
            f"{r['dense_seconds'] / r['seconds']:.2f} | {r['eigenvalue_difference']:.1e} | "
            f"{r['resolvent_error']:.1e} | {r['dense_resolvent_error']:.1e} |")
    write_page(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, temporary folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        widths, repeats, out = (1024,), 1, Path(tempfile.mkdtemp())
    else:
        widths, repeats, out = (1024, 2048, 4096, 6144, 8192), 2, ROOT / "docs" / "benchmarks"
    records = [measure(w, repeats if w <= 4096 else 1) for w in widths]
    with open(out / "spectrum.jsonl", "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    write_markdown(records, out / "spectrum.md")
    print(f"wrote {out / 'spectrum.md'}")


if __name__ == "__main__":
    main()
