"""The default recipe past memory: fit_auto on float32 memory-maps, in one and two processes.

Synthetic regression with a known smooth function of 10 inputs and Gaussian noise
(``NOISE_STD``), written to float32 ``.npy`` files (``x_N.npy`` ``(N, 10)``, ``y_N.npy``
``(N,)``, centred) in row blocks, so that writing them never holds them either. Every fit runs
in a fresh process (so its peak memory, ``ru_maxrss``, is that fit's alone) and reads the
files through ``np.load(..., mmap_mode="r")``:

* ``1`` process: ``fit_auto(x, y)`` on the memory-maps;
* ``2`` processes: two gloo processes (``torch.multiprocessing``) on this machine, each
  ``fit_auto(x[shard], y[shard], distributed=True)`` on its half of the rows.

Per fit: the wall time of ``fit_auto``, its time budget (the default rule unless
``--budget``), the final feature count, the peak resident memory of each process (memory-mapped
pages it touched count in it, as in ``ru_maxrss``), and on 10^4 held-out rows the RMSE against
the noisy targets over the noise's standard deviation (1 is the noise floor), the RMSE against
the noise-free function, and the share of the noisy targets inside the 95% predictive
intervals. Records are appended to ``docs/benchmarks/scale_out.jsonl`` and a rerun skips the
fits already recorded (so an interrupted run resumes); the page ``scale_out.md`` and the plot
of fit time against ``N`` are written from all records.

Usage::

    python benchmarks/scale_out.py --quick              # smoke run: 2*10^4 rows, 30 s budget
    python benchmarks/scale_out.py --sizes 100000 1000000
    python benchmarks/scale_out.py --sizes 10000000 --budget 600 --processes 1 2
    python benchmarks/scale_out.py --sizes 100000 --solve cg   # the CG path: a pass per product
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT_DIR = ROOT / "docs" / "benchmarks"
INPUTS = 10
NOISE_STD = 0.1
NUM_TEST = 10_000
WRITE_BLOCK = 1 << 20
SEED = 0


def truth(x: np.ndarray) -> np.ndarray:
    """The smooth function of 10 inputs in ``[0, 1]``: a few interactions, every input used."""
    x = x.astype(np.float64)
    return (np.sin(3.0 * x[:, 0]) + 0.5 * np.cos(2.0 * x[:, 1] + x[:, 2])
            + 0.8 * x[:, 3] * x[:, 4] + 0.3 * np.sin(2.0 * x[:, 5:].sum(1)))


def write_data(folder: Path, n: int) -> tuple:
    """``x_N.npy`` and ``y_N.npy`` (float32, ``y`` centred by its mean) and the mean, written
    block by block; reused when present."""
    folder.mkdir(parents=True, exist_ok=True)
    x_path, y_path = folder / f"x_{n}.npy", folder / f"y_{n}.npy"
    meta = folder / f"meta_{n}.json"
    if x_path.exists() and y_path.exists() and meta.exists():
        return x_path, y_path, json.loads(meta.read_text())["mean"]
    rng = np.random.default_rng(SEED)
    x = np.lib.format.open_memmap(x_path, mode="w+", dtype=np.float32, shape=(n, INPUTS))
    y = np.lib.format.open_memmap(y_path, mode="w+", dtype=np.float32, shape=(n,))
    total = 0.0
    for start in range(0, n, WRITE_BLOCK):
        stop = min(n, start + WRITE_BLOCK)
        xb = rng.random((stop - start, INPUTS), dtype=np.float32)
        yb = truth(xb) + NOISE_STD * rng.standard_normal(stop - start)
        x[start:stop], y[start:stop] = xb, yb
        total += float(yb.sum())
    mean = total / n
    for start in range(0, n, WRITE_BLOCK):
        y[start:start + WRITE_BLOCK] -= np.float32(mean)
    x.flush()
    y.flush()
    del x, y
    meta.write_text(json.dumps({"mean": mean}))
    return x_path, y_path, mean


def test_data(mean: float) -> tuple:
    rng = np.random.default_rng(SEED + 1)
    x = rng.random((NUM_TEST, INPUTS), dtype=np.float32)
    f = truth(x)
    return x, f - mean, f - mean + NOISE_STD * rng.standard_normal(NUM_TEST)


# ---------------------------------------------------------------------------- one fit
def _fit(spec: dict, rank: int = 0, world: int = 1) -> dict:
    import torch

    from rfgp import fit_auto
    from rfgp.recipes import FitReport

    torch.set_num_threads(spec["threads"])
    x = np.load(spec["x"], mmap_mode="r")
    y = np.load(spec["y"], mmap_mode="r")
    n = x.shape[0]
    rows = slice(rank * n // world, (rank + 1) * n // world)
    options = {"seed": SEED, "solve": spec.get("solve", "auto")}
    if spec["budget"] is not None:
        options["time_budget"] = spec["budget"]
    report = FitReport()
    started = time.perf_counter()
    gp = fit_auto(x[rows], y[rows], report=report, distributed=world > 1, **options)
    seconds = time.perf_counter() - started
    out = {"fit_s": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "budget_s": report.schedule.budget, "features": report.schedule.num_features,
           "path": report.schedule.final_solve,
           "predicted_s": sum(report.schedule.predicted.values()),
           "stage_s": {k: float(v) for k, v in report.seconds.items()}}
    # Every rank predicts: a distributed CG fit's variances are collective (a CG over the
    # query rows whose products sum every rank's rows).
    xt, ft, yt = test_data(spec["mean"])
    mean, std = gp.predict(torch.from_numpy(xt), return_std=True)
    if rank == 0:
        mean, std = mean.double().numpy(), std.double().numpy()
        spread = np.sqrt(std**2 + float(gp.noise))
        out.update({
            "rmse_over_noise": float(np.sqrt(np.mean((mean - yt) ** 2)) / NOISE_STD),
            "rmse_function": float(np.sqrt(np.mean((mean - ft) ** 2))),
            "coverage95": float(np.mean(np.abs(mean - yt) <= 1.959964 * spread)),
            "noise_std": math.sqrt(float(gp.noise)),
        })
    return out


def _rank(rank: int, world: int, port: int, spec: dict, out: str) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        Path(f"{out}.{rank}").write_text(json.dumps(_fit(spec, rank, world)))
    finally:
        dist.destroy_process_group()


def worker(spec: dict) -> dict:
    """One fit in this (fresh) process, or ``spec["processes"]`` spawned ranks."""
    world = spec["processes"]
    if world == 1:
        return _fit(spec)
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank")
        mp.spawn(_rank, args=(world, port, spec, out), nprocs=world, join=True)
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    result = dict(ranks[0])
    result["fit_s"] = max(r["fit_s"] for r in ranks)
    result["peak_mb"] = max(r["peak_mb"] for r in ranks)
    return result


def run_fresh(spec: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the page
def _final_fit(record: dict) -> str:
    """The final fit's seconds and its cost per row and squared feature count (the weight
    path sums one ``D x D`` Gram matrix per row: this is the figure that must not grow with
    ``N``), or dashes for a record without stage times."""
    seconds = record.get("stage_s", {}).get("refit")
    if seconds is None:
        return "— | —"
    return f"{seconds:.1f} | {1e9 * seconds / (record['n'] * record['features'] ** 2):.3f}"


def write_page(records: list, folder: Path) -> None:
    from _pages import write_page as keep_written

    lines = [
        "# Scale-out: the default recipe on memory-mapped rows, one and two processes",
        "",
        "`python benchmarks/scale_out.py` (see its docstring). Synthetic data: 10 inputs "
        f"uniform on [0, 1], a smooth function, Gaussian noise of standard deviation {NOISE_STD}; "
        "float32 `.npy` files fitted from memory-maps by `fit_auto` (default options, seed 0). "
        "RMSE / noise: the RMSE on 10^4 held-out noisy targets over the noise's standard "
        "deviation (1.00 is the noise floor). Peak memory: the largest `ru_maxrss` of the "
        "fit's processes, memory-mapped pages included.",
        "",
        "| rows | processes | budget (s) | fit (s) | predicted (s) | D | path | final fit (s) | "
        "final fit ns / (row D^2) | peak memory (MB) | RMSE / noise | RMSE to f | "
        "95% coverage | machine |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(records, key=lambda r: (r["n"], r["processes"], r["budget_s"])):
        lines.append(
            f"| {r['n']:,} | {r['processes']} | {r['budget_s']:.0f} | {r['fit_s']:.1f} | "
            f"{r['predicted_s']:.1f} | {r['features']} | {r.get('path', 'weight')} | "
            f"{_final_fit(r)} | "
            f"{r['peak_mb']:.0f} | "
            f"{r['rmse_over_noise']:.3f} | {r['rmse_function']:.4f} | {r['coverage95']:.3f} | "
            f"{r['note']} |")
    keep_written(folder / "scale_out.md", "\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for procs in sorted({r["processes"] for r in records}):
        points = sorted((r["n"], r["fit_s"]) for r in records if r["processes"] == procs)
        ax.loglog(*zip(*points), "o-", label=f"{procs} process{'es' if procs > 1 else ''}")
    ax.set_xlabel("rows N")
    ax.set_ylabel("fit time (s)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "scale_out.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2*10^4 rows, 30 s budget, into a temporary folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--budget", type=float, default=None,
                        help="time_budget in seconds (default: the recipe's default rule)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--solve", choices=("auto", "weight", "cg"), default="auto",
                        help="fit_auto's solve: 'cg' forces the CG path, a pass over the "
                             "memory-map per product")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "rfgp_scale_out")
    parser.add_argument("--note", default=platform.node(),
                        help="what the machine was doing (stored with each record)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.quick:
        args.sizes, args.budget = [20_000], args.budget or 30.0
    folder = args.out or (Path(tempfile.gettempdir()) / "rfgp_scale_out_quick" if args.quick
                          else OUT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "scale_out.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for n in args.sizes:
        x_path, y_path, mean = write_data(args.data, n)
        for procs in args.processes:
            key = (n, procs, args.budget, args.threads, args.solve)
            if any((r["n"], r["processes"], r["budget"], r["threads"], r.get("solve", "auto"))
                   == key for r in records):
                print(f"N={n} processes={procs}: recorded, skipped")
                continue
            spec = {"x": str(x_path), "y": str(y_path), "mean": mean, "processes": procs,
                    "budget": args.budget, "threads": args.threads, "solve": args.solve}
            result = run_fresh(spec)
            record = {"n": n, "processes": procs, "budget": args.budget,
                      "threads": args.threads, "solve": args.solve, "note": args.note, **result}
            records.append(record)
            with log.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(json.dumps(record))
            write_page(records, folder)


if __name__ == "__main__":
    main()
