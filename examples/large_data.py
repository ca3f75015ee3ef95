"""Data larger than memory: fit from a numpy memory-map, one chunk at a time.

Writes a million rows (4 inputs) to a memory-mapped file, as data too large to load would
be. The hyperparameters come from ``rfgp.fit_auto`` on a random sample of a few thousand
rows; ``gp.fit_stream`` then conditions that model on every row, chunk by chunk. It sums the
statistics :math:`\\Phi^\\top S^{-1} \\Phi` and :math:`\\Phi^\\top S^{-1} y` over the chunks, so
memory stays :math:`O(D^2 + \\text{chunk} \\cdot D)` whatever the number of rows, and the
result equals a fit on all rows at once. With more features than a ``D x D`` matrix allows,
``RandomFeatureGP(kernel, solve="cg")`` (or ``fit_auto(..., solve="cg")``) solves by conjugate
gradients instead.

Run: ``python examples/large_data.py`` (about a minute on two cores; the 40 MB file goes to a
temporary folder). ``RFGP_EXAMPLES_FAST=1`` uses 20,000 rows and a small budget.
"""

import os
import tempfile

import numpy as np
import torch

import rfgp

FAST = os.environ.get("RFGP_EXAMPLES_FAST") == "1"
ROWS = 20_000 if FAST else 1_000_000
SAMPLE = 500 if FAST else 4000  # rows the hyperparameters are chosen on
CHUNK = 50_000  # rows per chunk: the largest piece of data ever in memory


def truth(x: np.ndarray) -> np.ndarray:
    return np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.5 * x[:, 2] - 0.3 * x[:, 3] ** 2


def write_data(folder: str) -> np.memmap:
    """``(ROWS, 5)`` float64 rows ``[x_1..x_4, y]`` in a file, written chunk by chunk."""
    data = np.lib.format.open_memmap(os.path.join(folder, "data.npy"), mode="w+",
                                     dtype=np.float64, shape=(ROWS, 5))
    rng = np.random.default_rng(0)
    for start in range(0, ROWS, CHUNK):
        x = rng.uniform(-2, 2, size=(min(CHUNK, ROWS - start), 4))
        data[start:start + len(x), :4] = x
        data[start:start + len(x), 4] = truth(x) + 0.1 * rng.standard_normal(len(x))
    data.flush()
    return np.load(os.path.join(folder, "data.npy"), mmap_mode="r")


def chunks(data: np.memmap):
    for start in range(0, data.shape[0], CHUNK):
        block = torch.from_numpy(np.array(data[start:start + CHUNK]))  # one chunk in memory
        yield block[:, :4], block[:, 4]


def main() -> float:
    with tempfile.TemporaryDirectory() as folder:
        data = write_data(folder)
        sample = np.sort(np.random.default_rng(1).choice(ROWS, SAMPLE, replace=False))
        block = torch.from_numpy(np.array(data[sample]))
        # The recipe chooses a constant prior mean on the sample; the model keeps it, and
        # fit_stream subtracts it from every streamed row as fit would.
        # The features are sized for the rows the stream conditions on, not for the sample:
        # that fit costs N D^2 (2,048 features on a million rows: about a minute on two
        # cores), where the recipe left to itself sizes D for the sample's few thousand rows.
        options = (dict(time_budget=2.0, num_features=256, lengthscale_draws=0) if FAST
                   else dict(num_features=2048))
        gp = rfgp.fit_auto(block[:, :4], block[:, 4], seed=0, **options)
        gp.fit_stream(chunks(data), total=-(-ROWS // CHUNK))  # same kernel, every row
        print(f"conditioned on {gp.num_data} rows from the memory-map")

    x_test = torch.from_numpy(np.random.default_rng(2).uniform(-2, 2, size=(1000, 4)))
    mean, std = gp.predict(x_test, return_std=True)
    error = float((mean - torch.from_numpy(truth(x_test.numpy()))).pow(2).mean().sqrt())
    print(f"RMSE against the noise-free function: {error:.4f} (noise std 0.1); "
          f"mean posterior std {float(std.mean()):.4f}; noise std {float(gp.noise.sqrt()):.3f}")
    return error


if __name__ == "__main__":
    main()
