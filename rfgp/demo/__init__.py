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
from typing import Any, Dict, List, Optional, Sequence, Union

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


def _demo_threads() -> int:
    """The torch threads the demo runs on: ``RFGP_DEMO_THREADS`` (a positive integer), else 1;
    a ``ValueError`` naming the variable where it is set to anything else."""
    text = os.environ.get("RFGP_DEMO_THREADS", "1")
    try:
        threads = int(text)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(
            "the environment variable RFGP_DEMO_THREADS must be a positive integer (the demo's "
            f"torch threads), got {text!r}; unset it to run on one thread"
        )
    return threads


def main(output_dir: Union[str, os.PathLike] = "demo_output",
         examples: Optional[Sequence[str]] = None) -> List[dict]:
    """Run every example that can run here (or those named in ``examples``, names from
    :data:`EXAMPLES`), print the summary table and return its rows.

    Args:
        output_dir: the folder for the plots (created where missing).
        examples: a list of names from :data:`EXAMPLES` (``None``: all), e.g.
            ``["regression"]``; a single name as a string is refused, not split into letters.

    Raises:
        TypeError: for an ``output_dir`` that is not a path, or ``examples`` that is not a
            list of names.
        ValueError: for an unknown example, or an ``RFGP_DEMO_THREADS`` that is not a positive
            integer.
    """
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(
            f"output_dir must be a path (str or os.PathLike), got {type(output_dir).__name__} "
            f"{output_dir!r}"
        )
    if examples is not None and (isinstance(examples, (str, bytes)) or not all(
            isinstance(name, str) for name in examples)):
        hint = f"; pass [{examples!r}]" if isinstance(examples, str) else ""
        raise TypeError(
            f"examples must be None or a list of names from {EXAMPLES}, got "
            f"{type(examples).__name__} {examples!r}{hint}"
        )
    unknown = sorted(set(examples or []) - set(EXAMPLES))
    if unknown:
        raise ValueError(f"unknown example(s) {unknown}; the examples are {EXAMPLES}")
    threads = _demo_threads()

    import torch

    # The examples are small: a second thread gains little, and on a shared machine spinning
    # OpenMP threads can make them many times slower. RFGP_DEMO_THREADS overrides.
    torch.set_num_threads(threads)
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
