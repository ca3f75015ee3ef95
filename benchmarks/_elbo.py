"""Training a GPyTorch variational GP until its ELBO stops improving, shared by the regression
and classification benchmarks."""

from __future__ import annotations

import math
import sys
import time

import torch


def train_until_elbo_stalls(model, likelihood, x, y, generator: torch.Generator, *,
                            batch: int = 1024, tolerance: float = 1e-3, patience: int = 3,
                            max_epochs: int = 300, progress: bool = False) -> tuple:
    """Adam (lr 0.01) on minibatches of ``batch`` rows of the negative ELBO, epoch after epoch,
    until the mean loss per datum of an epoch has not improved on the best by more than
    ``tolerance`` for ``patience`` epochs (or ``max_epochs``): ``(epochs run, best mean loss)``. The
    model and likelihood are left in training mode. ``progress``: print each epoch's mean loss and
    seconds to standard error (long runs can then be watched)."""
    import gpytorch

    opt = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.shape[0])
    n = x.shape[0]
    best, stale, epochs = math.inf, 0, 0
    model.train()
    likelihood.train()
    while stale < patience and epochs < max_epochs:
        began = time.perf_counter()
        perm = torch.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, batch):
            idx = perm[start:start + batch]
            opt.zero_grad()
            loss = -mll(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * idx.numel()
        epochs += 1
        loss = total / n
        stale = 0 if loss < best - tolerance else stale + 1
        best = min(best, loss)
        if progress:
            print(f"epoch {epochs}: loss {loss:.6f} ({time.perf_counter() - began:.1f} s)",
                  file=sys.stderr, flush=True)
    return epochs, best
