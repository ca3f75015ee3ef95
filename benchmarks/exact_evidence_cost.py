"""The schedule's count of an exact block evidence against its measured time.

The recipe's local stage and its Laplace Hessian evaluate the exact kernel's evidence with its
gradient on blocks of at most 1,000 neighbouring rows
(:func:`rfgp.inference._blocks.kd_blocks`). The schedule
(:func:`rfgp.inference._evidence_cost.exact_evidence_cost`) predicts one evaluation on ``n`` rows of
``d`` inputs as :math:`n^3 + c_2 n^2 + c_d n^2 d` multiply-adds. This script times one
evaluation with its gradient (lengthscales, outputscale, noise) on a grid of block sizes and
input counts, and sets it against

* the count at the cost model's reference rate (what the schedule predicts), and
* the count at this machine's own matrix-product rate (``product_rate``), so that
  the ratio is free of the machine's speed;

then fits :math:`c_2` and :math:`c_d` to the measurements by relative least squares (with the
cubic coefficient held at 1: the Cholesky factor and the inverse the gradient needs).

Usage::

    python benchmarks/exact_evidence_cost.py            # n = 400 ... 1000, d = 4, 16, 32
    python benchmarks/exact_evidence_cost.py --quick    # n = 200, 400; d = 4, 16

Writes docs/benchmarks/exact_evidence_cost.md.
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _pages import best_of, study_options, write_page  # noqa: E402

from rfgp.inference._evidence import fourier_kernel_negative_log_evidence  # noqa: E402
from rfgp.inference._evidence_cost import exact_evidence_cost  # noqa: E402
from rfgp.inference._machine_rate import product_rate  # noqa: E402
from rfgp.kernels import FourierFeatureKernel  # noqa: E402
from rfgp.recipes import RegressionOptions  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
DT = torch.float64
#: The cost model's reference rate (the default ``machine_rate``).
REFERENCE_RATE = RegressionOptions().machine_rate


def schedule_constants():
    """``(c_2, c_d)`` of the schedule's count, read off :func:`exact_evidence_cost` (linear in
    ``d``)."""
    n = 100
    base = exact_evidence_cost(n, 0) - n**3
    return base / n**2, (exact_evidence_cost(n, 1) - n**3 - base) / n**2


def evaluation_seconds(n: int, d: int, repeats: int) -> float:
    """The shortest time of one exact evidence with its gradient on ``n`` rows, ``d`` inputs."""
    g = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, dtype=DT, generator=g)
    y = torch.randn(n, 1, dtype=DT, generator=g)
    kernel = FourierFeatureKernel(64, input_dim=d)
    x = kernel.prepare_input(x)
    ell = torch.full((d,), math.sqrt(d), dtype=DT, requires_grad=True)
    s = torch.ones((), dtype=DT, requires_grad=True)
    noise = torch.full((), 0.1, dtype=DT, requires_grad=True)

    def once():
        value = fourier_kernel_negative_log_evidence(kernel, x, y, ell, s, noise, exact=True)
        torch.autograd.grad(value, [ell, s, noise])

    return best_of(once, repeats, warmup=True)


def fit_constants(rows):
    """``(c_2, c_d)`` minimising the relative error of ``n^3 + c_2 n^2 + c_d n^2 d`` against
    the measured multiply-adds (seconds times the reference rate)."""
    a = torch.tensor([[n * n, n * n * d] for n, d, _ in rows], dtype=DT)
    work = torch.tensor([t * REFERENCE_RATE for *_, t in rows], dtype=DT)
    cubic = torch.tensor([float(n) ** 3 for n, _, _ in rows], dtype=DT)
    weight = 1.0 / work
    solution = torch.linalg.lstsq(a * weight[:, None], ((work - cubic) * weight)[:, None])
    c2, cd = solution.solution.reshape(-1).tolist()
    return c2, cd


def main():
    args, out = study_options(__doc__, OUT)
    sizes, dims = ([200, 400], [4, 16]) if args.quick else ([400, 625, 922, 1000], [4, 16, 32])
    repeats = 3 if args.quick else 5
    rate = product_rate()
    rows = []
    for n in sizes:
        for d in dims:
            seconds = evaluation_seconds(n, d, repeats)
            rows.append((n, d, seconds))
            print(f"n={n:5d} d={d:3d} {seconds * 1e3:8.1f} ms", flush=True)
    c2, cd = fit_constants(rows)
    used_c2, used_cd = schedule_constants()
    lines = [
        "# The schedule's count of an exact block evidence", "",
        "One evaluation of the exact kernel's evidence with its gradient (lengthscales, "
        "outputscale, noise) on `n` rows of `d` inputs: the shortest of "
        f"{repeats} runs, against the schedule's count "
        f"`n^3 + {used_c2:g} n^2 + {used_cd:g} n^2 d` "
        "(`rfgp.inference._evidence_cost.exact_evidence_cost`) converted to seconds at the "
        "cost model's "
        f"reference rate ({REFERENCE_RATE:.3g} multiply-adds/s) and at this machine's "
        f"matrix-product rate ({rate:.3g}/s, `product_rate`), and against the earlier "
        "count `n^3/3 + 3 n^2 d` at the reference rate.", "",
        f"Records of `python benchmarks/exact_evidence_cost.py"
        f"{' --quick' if args.quick else ''}` ({platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)).", "",
        "| n | d | measured (ms) | count at the reference rate (ms) | measured / count | "
        "count at the machine's product rate (ms) | measured / that | "
        "measured / earlier count |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, d, seconds in rows:
        work = exact_evidence_cost(n, d)
        earlier = (n**3 / 3 + 3 * n * n * d) / REFERENCE_RATE
        lines.append(
            f"| {n} | {d} | {seconds * 1e3:.1f} | {work / REFERENCE_RATE * 1e3:.1f} | "
            f"{seconds * REFERENCE_RATE / work:.2f} | {work / rate * 1e3:.1f} | "
            f"{seconds * rate / work:.2f} | {seconds / earlier:.2f} |")
    lines += ["", f"Constants fitted to this run (cubic coefficient 1): `c_2 = {c2:.0f}`, "
              f"`c_d = {cd:.1f}` (the schedule uses {used_c2:g} and "
              f"{used_cd:g}).", ""]
    path = out / "exact_evidence_cost.md"
    write_page(path, "\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
