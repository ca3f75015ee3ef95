"""FeatureStatistics: the shared-Gram path for noise that is common except on a few rows."""

import pytest
import torch

from rfgp.inference._statistics import FeatureStatistics, accumulate_gram, symmetrize_upper


def _dirichlet_like(n, width, classes, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, width, generator=g, dtype=torch.float64)
    y = torch.randn(n, classes, generator=g, dtype=torch.float64)
    labels = torch.randint(classes, (n,), generator=g)
    onehot = torch.nn.functional.one_hot(labels, classes).to(torch.float64)
    noise = torch.log1p(1.0 / (0.01 + onehot))  # two values per column
    return z, y, noise


def _generic_grams(z, noise):
    return [z.T @ (z / noise[:, c : c + 1]) for c in range(noise.shape[1])]


@pytest.mark.parametrize("chunks", [1, 3])
def test_shared_gram_path_equals_the_direct_products(chunks):
    z, y, noise = _dirichlet_like(600, 300, 5, seed=0)
    stats = FeatureStatistics(300, 5, True, torch.float64, torch.device("cpu"))
    for part in torch.arange(600).chunk(chunks):
        stats.add(z[part], y[part], noise[part])
    assert stats.column_groups() == [[c] for c in range(5)]
    for c, expected in enumerate(_generic_grams(z, noise)):
        got = stats.gram(c)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12 * expected.abs().max())
        assert torch.allclose(got, got.T, rtol=0, atol=1e-12 * expected.abs().max())
    assert torch.allclose(stats.rhs, z.T @ (y / noise), rtol=1e-12, atol=1e-12)


def test_shared_gram_path_with_a_common_value_smaller_than_the_rest():
    # W_g - w_g is then positive on the differing rows; with it negative (above) both signs
    # of the correction are covered.
    z, y, noise = _dirichlet_like(400, 64, 4, seed=1)
    noise = 1.0 / noise
    stats = FeatureStatistics(64, 4, True, torch.float64, torch.device("cpu"))
    stats.add(z, y, noise)
    for c, expected in enumerate(_generic_grams(z, noise)):
        assert torch.allclose(stats.gram(c), expected, rtol=0, atol=1e-12 * expected.abs().max())


def test_accumulate_gram_with_signed_weights():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(50, 600, generator=g, dtype=torch.float64)
    w = torch.randn(50, generator=g, dtype=torch.float64)
    gram = torch.zeros(600, 600, dtype=torch.float64)
    accumulate_gram(gram, z, w, alpha=2.0)
    expected = 2.0 * z.T @ (z * w.unsqueeze(-1))
    tol = 1e-12 * expected.abs().max()
    assert torch.allclose(symmetrize_upper(gram), expected, rtol=0, atol=tol)
