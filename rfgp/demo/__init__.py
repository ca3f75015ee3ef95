"""The end-to-end demo: runs every example and prints one summary table.

Regression with uncertainty (UCI concrete: rfgp's default recipe and the exact GP against random
Fourier features), classification with calibrated probabilities (digits and breast cancer:
Dirichlet GPs, accuracy, MNLL and calibration error) and the Helmholtz decomposition of the
bundled wind field. About a minute on two cores.

Each example in :data:`EXAMPLES` (an internal module ``rfgp.demo._NAME``) has a function
``main(output_dir) -> list[dict]`` that writes its plots into ``output_dir`` and returns summary
rows, each a dict with ``method``, ``data``, ``metrics`` (name -> value) and ``time_s``. The
plots need matplotlib (the ``plot`` extra) and the classification example needs scikit-learn's
bundled data sets (the ``sklearn`` extra); without them the demo says so and runs the rest.

Usage::

    python -m rfgp.demo [output_dir]                  # default output_dir: demo_output/
    python -m rfgp.demo [output_dir] --only NAME ...  # only the examples named

Runs single-threaded unless ``RFGP_DEMO_THREADS`` says otherwise.

Example:
    >>> print(format_table([{"example": "regression", "method": "m", "data": "d",
    ...                      "metrics": {"RMSE": 0.25}, "time_s": 1.0}]))
    example     method  data  metrics     time [s]
    ----------  ------  ----  ----------  --------
    regression  m       d     RMSE 0.250  1.00
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["EXAMPLES", "REQUIRES", "format_table", "main", "pyplot"]

#: the examples run by the demo (internal modules ``rfgp.demo._<name>``), in order.
EXAMPLES: List[str] = ["regression", "classification", "vector_field"]

#: ``{example: (module it imports, extra that installs it)}`` for examples with extra needs.
REQUIRES: Dict[str, tuple] = {"classification": ("sklearn", "sklearn")}

_said: Dict[str, bool] = {}


def pyplot() -> Optional[Any]:
    """``matplotlib.pyplot`` on the file-only Agg backend, or ``None`` where matplotlib is not
    installed (said once: the examples then skip their plots)."""
    if importlib.util.find_spec("matplotlib") is None:
        if not _said.get("matplotlib"):
            _said["matplotlib"] = True
            print("  (matplotlib is not installed, so no plots are written: "
                  "pip install \"rfgp[plot]\")", flush=True)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in [header, ["-" * w for w in widths], *body]]
    return "\n".join(lines)


def main(output_dir: str = "demo_output", examples: Optional[List[str]] = None) -> List[dict]:
    """Run every example that can run here (or those named in ``examples``, names from
    :data:`EXAMPLES`), print the summary table and return its rows."""
    import torch

    unknown = sorted(set(examples or []) - set(EXAMPLES))
    if unknown:
        raise ValueError(f"unknown example(s) {unknown}; the examples are {EXAMPLES}")

    # The examples are small: a second thread gains little, and on a shared machine spinning
    # OpenMP threads can make them many times slower. RFGP_DEMO_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("RFGP_DEMO_THREADS", "1")))
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    rows: List[dict] = []
    start = time.perf_counter()
    for name in EXAMPLES:
        if examples is not None and name not in examples:
            continue
        print(f"== {name}", flush=True)
        needs = REQUIRES.get(name)
        if needs is not None and importlib.util.find_spec(needs[0]) is None:
            print(f"  skipped: it needs {needs[0]} (pip install \"rfgp[{needs[1]}]\")", flush=True)
            continue
        module = importlib.import_module(f"rfgp.demo._{name}")
        for row in module.main(str(output)):
            rows.append({"example": name, **row})
    print()
    print(format_table(rows))
    print()
    print(f"Output in {output.resolve()}/ (total {time.perf_counter() - start:.0f} s)")
    return rows
