"""TensorSketch: the count sketch it is built from, and its FFT convolution."""

import torch

from rfgp.kernels._sketches.tensorsketch import count_sketch


def dense_count_sketch_matrix(hashes, signs, num_features):
    """C with C[h(t), t] = s_t: the count sketch as a dense (D, d) matrix."""
    c = torch.zeros(num_features, hashes.shape[-1], dtype=torch.float64)
    c[hashes, torch.arange(hashes.shape[-1])] = signs
    return c


def test_count_sketch_is_the_sparse_matrix_product():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g)
    hashes = torch.randint(0, 4, (5,), generator=g)
    signs = torch.randint(0, 2, (5,), generator=g).double() * 2 - 1
    expected = x @ dense_count_sketch_matrix(hashes, signs, 4).T
    torch.testing.assert_close(count_sketch(x, hashes, signs, 4), expected)


def test_batched_count_sketches_match_one_at_a_time():
    # (*B, k, d) hashes: k sketches at once, output (..., N, k, D); same values as 1-D hashes.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 5, dtype=torch.float64, generator=g)
    hashes = torch.randint(0, 7, (2, 3, 5), generator=g)
    signs = torch.randint(0, 2, (2, 3, 5), generator=g).double() * 2 - 1
    out = count_sketch(x, hashes, signs, 7)
    assert out.shape == (2, 6, 3, 7)
    for b in range(2):
        for i in range(3):
            one = count_sketch(x[b], hashes[b, i], signs[b, i], 7)
            torch.testing.assert_close(out[b, :, i], one)
