"""The benchmarks' run loop and records, in one place.

A benchmark appends one JSON line per finished run (a data set, split, seed and method, with
its scores and seconds) to its records file, so that a run cut short keeps what it finished
and a rerun does only what is missing; its page is then written from the records alone
(``--page-only``). :class:`Records` is that file, :func:`timed` the timer of one run and
:func:`run_missing` the loop over the runs a records file lacks, :func:`grouped` and
:func:`mean_spread` the tables' groups and cells. Pages are written by
:func:`_pages.write_page`, which keeps a page's hand-written section.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Sequence, Set, Tuple

import numpy as np


class Records:
    """A JSON-lines file of finished runs, appended to one line at a time.

    Example:
        >>> import tempfile
        >>> records = Records(Path(tempfile.mkdtemp()) / "runs.jsonl")
        >>> records.append({"set": "concrete", "split": 0, "rmse": 0.25})
        >>> records.rows(), records.done("set", "split")
        ([{'set': 'concrete', 'split': 0, 'rmse': 0.25}], {('concrete', 0)})
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def rows(self) -> List[dict]:
        """Every record, in the order written (none when the file does not exist)."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def done(self, *fields: str) -> Set[Tuple[Any, ...]]:
        """The ``fields`` tuples of the records: the keys of the runs already finished."""
        return {tuple(row[field] for field in fields) for row in self.rows()}

    def append(self, row: dict) -> None:
        """Write ``row`` as one line (NumPy and torch scalars as floats), at once: a run
        interrupted later keeps it."""
        with self.path.open("a") as handle:
            handle.write(json.dumps(row, default=float) + "\n")


def timed(fn: Callable[[], Any]) -> Tuple[Any, float]:
    """``(fn(), seconds)``: the wall time of one call."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run_missing(records: Records, tasks: Iterable[dict], fields: Tuple[str, ...],
                run: Callable[[dict], None]) -> None:
    """Call ``run(task)`` for each task whose ``fields`` are not yet in ``records``, in order
    (the set of finished keys is read once, before the first run)."""
    done = records.done(*fields)
    for task in tasks:
        if tuple(task[field] for field in fields) not in done:
            run(task)


def grouped(rows: Iterable[dict], *fields: str) -> Dict[Tuple[Any, ...], List[dict]]:
    """The records by the values of ``fields``, each group in the records' order.

    Example:
        >>> grouped([{"set": "a", "s": 0}, {"set": "b", "s": 0}, {"set": "a", "s": 1}], "set")
        {('a',): [{'set': 'a', 's': 0}, {'set': 'a', 's': 1}], ('b',): [{'set': 'b', 's': 0}]}
    """
    table: Dict[Tuple[Any, ...], List[dict]] = {}
    for row in rows:
        table.setdefault(tuple(row[field] for field in fields), []).append(row)
    return table


def mean_spread(values: Sequence[float], digits: int = 3) -> str:
    """A table cell: ``mean ± standard deviation`` (NumPy's, ``ddof=0``) of ``values``, or the
    value alone when there is one.

    Example:
        >>> mean_spread([0.5]), mean_spread([1.0, 2.0], 1)
        ('0.500', '1.5 ± 0.5')
    """
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"
