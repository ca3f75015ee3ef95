"""Running a test's work on several gloo processes of one machine (imported, not fixtures).

The ranks meet at a file store (no store server thread on rank 0 for another rank to outlive
at exit) and leave together after a closing barrier. A rank that dies after every rank has
saved its results and passed that barrier died in the process group's teardown, outside the
package: the results are checked as usual and the death is reported as a warning. A death
before that fails the test, as does a rank left waiting past the deadline.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable, List, Sequence

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Every scenario of the suite ends well within this: a hang in a collective would not.
DEADLINE_S = 240


def join(rank: int, store_path: str, world: int) -> None:
    """Inside a worker: join the gloo group of ``world`` ranks at the file ``store_path``."""
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def leave(results: Any, out_path: str, rank: int) -> None:
    """Inside a worker: save ``results``, meet the other ranks, mark this rank done and tear
    the group down (call it last, or ``dist.destroy_process_group()`` in a ``finally``)."""
    torch.save(results, f"{out_path}.{rank}")
    dist.barrier()
    open(f"{out_path}.{rank}.done", "w").close()


def run(worker: Callable[..., None], tmp_path: Any, args: Sequence[Any] = (),
        world: int = 2) -> List[Any]:
    """``worker(rank, store_path, out_path, *args)`` on ``world`` processes; each rank's
    results as :func:`leave` saved them, in rank order."""
    out = str(tmp_path / "result")
    context = mp.spawn(worker, args=(str(tmp_path / "store"), out, *args), nprocs=world,
                       join=False)
    started = time.monotonic()
    try:
        while not context.join(timeout=2):
            if time.monotonic() - started > DEADLINE_S:
                for process in context.processes:
                    process.kill()
                pytest.fail(f"the ranks did not finish within {DEADLINE_S} s: a rank was "
                            "left waiting")
    except mp.ProcessExitedException as error:
        if not all(os.path.exists(f"{out}.{r}.done") for r in range(world)):
            raise
        warnings.warn(f"a rank died in the process group's teardown, after its work: {error}")
    return [torch.load(f"{out}.{r}") for r in range(world)]
