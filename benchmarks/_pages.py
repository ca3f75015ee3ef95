"""Helpers of the benchmark scripts: pages with a hand-written reading, options, timing."""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence, Tuple

import torch

#: The heading of the hand-written section a regenerated page keeps.
WRITTEN_HEADING = "## What this run shows"


def write_page(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, keeping the old page's hand-written section.

    The section starts at :data:`WRITTEN_HEADING` and runs to the end of the page; a rerun
    regenerates the tables above it, and the section should then be reread against them.
    """
    path = Path(path)
    if path.exists():
        old = path.read_text()
        at = old.find(WRITTEN_HEADING)
        if at >= 0 and WRITTEN_HEADING not in text:
            text = text.rstrip("\n") + "\n\n" + old[at:]
    path.write_text(text)


def study_options(description: str, out: Path) -> Tuple[argparse.Namespace, Path]:
    """Parse a study's ``--quick``, ``--threads`` and ``--out``; set torch's thread count.

    Returns the arguments and the folder to write to: ``--out``, else ``out`` (the temporary
    folder for ``--quick`` runs, so that a quick run never overwrites a page), created.
    """
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    folder = args.out or (Path(tempfile.gettempdir()) if args.quick else out)
    folder.mkdir(parents=True, exist_ok=True)
    return args, folder


def paired_difference(values: Sequence[float], base: Sequence[float]) -> str:
    """``mean ± standard error`` of the paired differences ``values - base`` (``0`` if equal)."""
    diff = [a - b for a, b in zip(values, base)]
    if all(d == 0 for d in diff):
        return "0"
    mean = sum(diff) / len(diff)
    if len(diff) < 2:
        return f"{mean:+.3f}"
    se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (len(diff) - 1) / len(diff))
    return f"{mean:+.3f} ± {se:.3f}"


def best_of(fn: Callable[[], object], repeats: int, warmup: bool = False) -> float:
    """The shortest wall time of ``repeats`` calls of ``fn`` (after one untimed call if
    ``warmup``): the least disturbed measurement on a shared machine."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def device_name(device: str) -> str:
    """The processor or GPU behind ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``), for records."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def synchronize(device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA), so that a timer sees all of it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
