"""The end-to-end demo: runs every example and prints one summary table.

Regression with uncertainty (UCI concrete: exact GP against random Fourier features),
classification with calibrated probabilities (digits and breast cancer: Dirichlet GPs, accuracy,
MNLL and calibration error) and the Helmholtz decomposition of the bundled wind field. About
a minute on two cores.

Each example module in :data:`EXAMPLES` (a file next to this one) has a function
``main(output_dir) -> list[dict]`` that writes its plots into ``output_dir`` and returns summary
rows, each a dict with ``method``, ``data``, ``metrics`` (name -> value) and ``time_s``.

Usage::

    python examples/demo.py [output_dir]      # default output_dir: demo_output/

Runs single-threaded unless ``RFGP_DEMO_THREADS`` says otherwise.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import List

#: example modules run by the demo, in order.
EXAMPLES: List[str] = ["regression", "classification", "vector_field"]


def _number(value: float) -> str:
    # Three decimals, or three significant digits for small values such as MSEs.
    return f"{value:.3f}" if value == 0 or abs(value) >= 0.01 else f"{value:.3g}"


def format_table(rows: List[dict]) -> str:
    """One aligned text table of the rows (columns example, method, data, metrics, time)."""
    header = ["example", "method", "data", "metrics", "time [s]"]
    body = [
        [
            row["example"],
            row["method"],
            row["data"],
            ", ".join(f"{name} {_number(value)}" for name, value in row["metrics"].items()),
            f"{row['time_s']:.2f}",
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in
             [header, ["-" * w for w in widths], *body]]
    return "\n".join(lines)


def main(output_dir: str = "demo_output") -> List[dict]:
    import torch

    # The examples are small: a second thread gains little, and on a shared machine spinning
    # OpenMP threads can make them many times slower. RFGP_DEMO_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("RFGP_DEMO_THREADS", "1")))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    rows: List[dict] = []
    start = time.perf_counter()
    for name in EXAMPLES:
        print(f"== {name}", flush=True)
        module = importlib.import_module(name)
        for row in module.main(str(output)):
            rows.append({"example": name, **row})
    print()
    print(format_table(rows))
    print()
    print(f"Plots written to {output.resolve()}/ (total {time.perf_counter() - start:.0f} s)")
    return rows


if __name__ == "__main__":
    main(*sys.argv[1:2])
