"""The passes of the iterative solve: a product with ``B - I = Phi^T S^-1 Phi`` over cached
feature chunks, and the dense ``B``, against the machine's own matrix-multiply speed.

Every CG iteration, every block of the Nystrom sketch and every Krylov run of the calibration
is one pass over the rows: per chunk of 4,096 rows, ``Phi_c V`` and then ``Phi_c^T W`` for a
block of ``k`` columns. ``FeatureOperator.gram`` takes both halves in their row-major forms
(``V^T Phi_c^T`` and the adjoint of the sum, ``W^T Phi_c``, accumulated as ``(k, D)``); the
plain form, ``Phi_c @ V`` and ``out.addmm_(Phi_c.T, W)``, is timed beside it on the same
chunks. The dense ``B`` (the first predictive variances' dense route) is formed from its
upper block triangle; the full product is timed beside it. Each time is also given as the
rate of multiply-adds it reaches against a square float64 matrix product timed in the same
run.

Usage::

    python benchmarks/feature_passes.py            # about five minutes on two cores
    python benchmarks/feature_passes.py --quick    # seconds, into a temporary folder

Writes docs/benchmarks/feature_passes.md (its hand-written reading kept) and .jsonl.
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
from rfgp.inference._feature_operator import FeatureOperator  # noqa: E402
from rfgp.kernels import FourierFeatureKernel  # noqa: E402

DT = torch.float64
CHUNK = 4096


def matmul_rate(size: int, repeats: int) -> float:
    """Multiply-adds per second of a square ``size`` float64 product."""
    a = torch.randn(size, size, dtype=DT)
    b = torch.randn(size, size, dtype=DT)
    return size**3 / best_of(lambda: a @ b, repeats, warmup=True)


def operator_of(rows: int, width: int) -> FeatureOperator:
    """An in-memory operator over ``rows`` random rows of 9 inputs and ``width`` random
    Fourier features, every chunk cached (after the first pass)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 9, generator=g, dtype=DT)
    kernel = FourierFeatureKernel(width, seed=0).double()
    noise = torch.full((rows, 1), 0.3, dtype=DT)
    op = FeatureOperator(FeatureMap(kernel), [(x, torch.zeros(rows, 1, dtype=DT), noise)],
                         False, DT, chunk=CHUNK, cache_bytes=1 << 40)
    op.gram(torch.zeros(op.width, 1, dtype=DT), [0])
    return op


def plain_gram(op: FeatureOperator, v: torch.Tensor) -> torch.Tensor:
    """``Phi^T S^-1 Phi V`` as ``Phi_c @ V`` and ``out.addmm_(Phi_c.T, W)`` per chunk."""
    out = torch.zeros_like(v)
    for feats, _, noise in op.chunks():
        out.addmm_(feats.transpose(0, 1), (feats @ v) / noise)
    return out


def plain_dense(op: FeatureOperator) -> torch.Tensor:
    """``B`` as the full product per chunk."""
    out = torch.zeros(op.width, op.width, dtype=DT)
    for feats, _, noise in op.chunks():
        out.addmm_(feats.transpose(0, 1), feats / noise)
    out.diagonal().add_(1.0)
    return out


def measure(rows: int, width: int, columns, repeats: int, rate: float, dense: bool) -> list:
    op = operator_of(rows, width)
    entries = float(rows) * op.width
    records = []
    g = torch.Generator().manual_seed(1)
    for k in columns:
        v = torch.randn(op.width, k, generator=g, dtype=DT)
        new = op.gram(v, [0] * k)
        old = plain_gram(op, v)
        error = float((new - old).abs().max() / old.abs().max())
        t_new = best_of(lambda v=v, k=k: op.gram(v, [0] * k), repeats, warmup=True)
        t_old = best_of(lambda v=v: plain_gram(op, v), repeats, warmup=True)
        work = 2.0 * entries * k  # the two halves' multiply-adds
        records.append({"what": "pass", "rows": rows, "width": op.width, "columns": k,
                        "seconds": t_new, "plain_seconds": t_old, "relative_difference": error,
                        "rate_share": work / t_new / rate,
                        "plain_rate_share": work / t_old / rate})
        print(records[-1], flush=True)
    if dense:
        new, old = op.dense(0), plain_dense(op)
        error = float((new - old).abs().max() / old.abs().max())
        t_new = best_of(lambda: op.dense(0), 1, warmup=True)
        t_old = best_of(lambda: plain_dense(op), 1, warmup=True)
        work = entries * op.width
        records.append({"what": "dense", "rows": rows, "width": op.width, "columns": op.width,
                        "seconds": t_new, "plain_seconds": t_old, "relative_difference": error,
                        "rate_share": work / t_new / rate,
                        "plain_rate_share": work / t_old / rate})
        print(records[-1], flush=True)
    return records


def write_markdown(records: list, rate: float, path: Path) -> None:
    lines = [
        "# The passes of the iterative solve against the matrix-multiply speed",
        "",
        "Written by `benchmarks/feature_passes.py` (module docstring: what is timed). "
        f"Machine: {platform.machine()}, {torch.get_num_threads()} threads, float64, "
        f"PyTorch {torch.__version__}; a square product runs at {rate / 1e9:.1f}e9 "
        "multiply-adds per second. `rate share`: the multiply-adds of the product "
        "(`2 N D k` for a pass, `N D^2` for the dense `B`) per second over the square "
        "product's rate. Best of the repeats, nothing else running.",
        "",
        "| product | rows N | width D | columns k | seconds | plain form (s) | speed-up | "
        "rate share | plain rate share | max relative difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['what']} | {r['rows']:,} | {r['width']:,} | {r['columns']:,} | "
            f"{r['seconds']:.3f} | {r['plain_seconds']:.3f} | "
            f"{r['plain_seconds'] / r['seconds']:.2f} | {r['rate_share']:.2f} | "
            f"{r['plain_rate_share']:.2f} | {r['relative_difference']:.1e} |")
    write_page(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, temporary folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        shapes, columns, repeats, out = [(5000, 2048, True)], (1, 9), 1, Path(tempfile.mkdtemp())
    else:
        shapes = [(13500, 8192, True), (40000, 16384, False)]
        columns, repeats, out = (1, 2, 3, 5, 9, 17, 33, 65, 257), 2, ROOT / "docs" / "benchmarks"
    rate = matmul_rate(2048 if args.quick else 4096, repeats)
    records = []
    for rows, width, dense in shapes:
        records += measure(rows, width, columns, repeats, rate, dense)
    with open(out / "feature_passes.jsonl", "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    write_markdown(records, rate, out / "feature_passes.md")
    print(f"wrote {out / 'feature_passes.md'}")


if __name__ == "__main__":
    main()
