"""Feature maps of composed kernels (sums, products, scales, active_dims).

The exact identities (sums, tensor products) compare with GPyTorch's own evaluation of the same
tree on the same draws; the statistical ones (elementwise products) compare Monte Carlo means
and variances over fresh draws with kernels computed independently of rfgp (GPyTorch's
``RBFKernel`` and the polynomial formula) and with the closed-form variance, within a few
Monte Carlo standard errors.
"""

from __future__ import annotations

import math
import pickle

import gpytorch
import pytest
import torch
from gpytorch.kernels import AdditiveKernel, RBFKernel, ScaleKernel

from rfgp import DirichletGPClassifier, RandomFeatureGP
from rfgp.kernels import (
    ComposedFeatureKernel,
    FourierFeatureKernel,
    MaclaurinKernel,
    PolynomialSketchKernel,
    as_feature_kernel,
)
from rfgp.kernels._product_variance import product_variance
from rfgp.variance import sketch_variance

DT = torch.float64


def rbf(x, y, lengthscale):
    kernel = RBFKernel().double()
    kernel.lengthscale = torch.tensor(lengthscale, dtype=DT)
    with torch.no_grad():
        return kernel(x, y, diag=True)


def polynomial(x, y, degree, bias, lengthscale=1.0):
    return ((x * y).sum(-1) / lengthscale**2 + bias) ** degree


def mixed_tree(width=32, complex_poly=False):
    """scale * RFF(dims 0,1) + RFF(dim 2) * poly(dims 2,3): sum, product, scale, active_dims."""
    rff = FourierFeatureKernel(width, active_dims=[0, 1], seed=1)
    rff.lengthscale = torch.tensor(0.8)
    scaled = ScaleKernel(rff)
    scaled.outputscale = torch.tensor(1.7)
    left = FourierFeatureKernel(width, active_dims=[2], seed=2)
    left.lengthscale = torch.tensor(1.3)
    right = PolynomialSketchKernel(
        2, width, bias=0.5, projection="gaussian", complex=complex_poly, active_dims=[2, 3],
        seed=3,
    )
    return (scaled + left * right).double()


def exact_mixed(x, y):
    return 1.7 * rbf(x[:, :2], y[:, :2], 0.8) + rbf(x[:, 2:3], y[:, 2:3], 1.3) * polynomial(
        x[:, 2:], y[:, 2:], 2, 0.5
    )


def pairs(n=4, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 0.6 * torch.randn(n, d, generator=g, dtype=DT)
    y = x + 0.4 * torch.randn(n, d, generator=g, dtype=DT)
    return x, y


def estimates(kernel, x, y):
    with torch.no_grad():
        return (kernel.real_features(x) * kernel.real_features(y)).sum(-1)


def monte_carlo(kernel, x, y, draws, seed):
    g = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(draws):
        kernel.resample(g)
        values.append(estimates(kernel, x, y))
    return torch.stack(values)  # (draws, n)


# ---------------------------------------------------------------- exact identities
def test_sum_is_exact_concatenation_of_scaled_parts():
    a = ScaleKernel(FourierFeatureKernel(16, active_dims=[0, 1], seed=0))
    a.outputscale = torch.tensor(2.5)
    b = PolynomialSketchKernel(3, 8, bias=1.0, projection="rademacher", active_dims=[2], seed=1)
    tree = (a + b).double()
    k = as_feature_kernel(tree)
    x = torch.randn(7, 3, dtype=DT)
    phi = k.features(x)
    assert phi.shape == (7, 24) and k.num_features == 24
    expected = torch.cat(
        [a.outputscale.sqrt() * a.base_kernel.features(x), b.features(x)], dim=-1
    )  # each part applies its own active_dims
    torch.testing.assert_close(phi, expected, rtol=0, atol=0)
    x2 = torch.randn(5, 3, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(k(x, x2).to_dense(), tree(x, x2).to_dense())
        torch.testing.assert_close(k(x).to_dense(), tree(x).to_dense())
        torch.testing.assert_close(k(x, diag=True), tree(x, diag=True))


def test_sum_written_into_a_buffer_is_the_concatenation_of_its_parts():
    # A pass's buffer route (no autograd): the parts are written side by side into one buffer,
    # a Fourier part straight into its block, a scaled part scaled in place, a sketch part and
    # an elementwise product copied in; the result is the buffer and equals the parts' own
    # features side by side.
    a = ScaleKernel(FourierFeatureKernel(16, active_dims=[0, 1], seed=0))
    a.outputscale = torch.tensor(2.5)
    b = PolynomialSketchKernel(3, 8, bias=1.0, projection="rademacher", active_dims=[2], seed=1)
    c = FourierFeatureKernel(6, seed=2)
    product = FourierFeatureKernel(10, active_dims=[0], seed=3) * PolynomialSketchKernel(
        2, 10, bias=1.0, projection="gaussian", active_dims=[1], seed=4)
    tree = (a + b + c + ScaleKernel(product)).double()
    k = as_feature_kernel(tree, seed=5)
    x = torch.randn(9, 3, dtype=DT)
    x.requires_grad_(False)
    expected = k.features(x).detach()
    parts = torch.cat([a.outputscale.sqrt() * a.base_kernel.features(x), b.features(x),
                       c.features(x)], -1).detach()
    torch.testing.assert_close(expected[:, :30], parts, rtol=0, atol=0)
    out = torch.full((9, k.num_features), float("nan"), dtype=DT)
    with torch.no_grad():
        phi = k._features_into(k.prepare_input(x), out)
    assert phi.data_ptr() == out.data_ptr() and bool(torch.isfinite(out).all())
    # cos and sin through a strided block against contiguous: a few ulps at most
    torch.testing.assert_close(phi, expected, rtol=0, atol=8 * torch.finfo(DT).eps)
    with torch.no_grad(), pytest.raises(ValueError, match="out must have shape"):
        c._features_into(c.prepare_input(x), torch.empty(9, 7, dtype=DT))


def test_buffer_route_falls_back_where_it_cannot_write():
    # With autograd, or for complex features, the buffer is not written: the features come
    # back as a tensor of their own, gradients intact.
    k = as_feature_kernel(FourierFeatureKernel(8, seed=0) + FourierFeatureKernel(8, seed=1))
    k = k.double()
    x = torch.randn(4, 2, dtype=DT)
    out = torch.zeros(4, 16, dtype=DT)
    phi = k._features_into(k.prepare_input(x), out)
    assert phi.requires_grad and phi.data_ptr() != out.data_ptr() and not out.any()
    torch.testing.assert_close(phi, k.features(x), rtol=0, atol=0)
    z = as_feature_kernel(FourierFeatureKernel(8, seed=0) + PolynomialSketchKernel(
        2, 8, projection="gaussian", complex=True, seed=1)).double()
    with torch.no_grad():
        phi = z._features_into(z.prepare_input(x), torch.zeros(4, 32, dtype=DT))
        torch.testing.assert_close(phi, z.features(x), rtol=0, atol=0)
    assert phi.is_complex()


def test_tensor_product_equals_gpytorch_product_on_the_same_draws():
    a = FourierFeatureKernel(6, active_dims=[0], seed=0)
    b = ScaleKernel(PolynomialSketchKernel(2, 5, bias=0.3, projection="gaussian", seed=1))
    c = FourierFeatureKernel(4, spectral="matern32", active_dims=[1, 2], seed=2)
    tree = (a * b * c).double()
    k = as_feature_kernel(tree, product="tensor")
    assert k.num_features == 6 * 5 * 4
    x, y = torch.randn(6, 3, dtype=DT), torch.randn(4, 3, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(k(x, y).to_dense(), tree(x, y).to_dense())


def test_nested_scale_follows_gpytorch_active_dims_semantics():
    # ScaleKernel copies its base kernel's active_dims and does not select again.
    inner = FourierFeatureKernel(8, active_dims=[1, 2], seed=0)
    tree = ScaleKernel(ScaleKernel(inner) + FourierFeatureKernel(8, active_dims=[0], seed=1))
    tree = tree.double()
    k = as_feature_kernel(tree)
    x = torch.randn(5, 3, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(k(x).to_dense(), tree(x).to_dense())


def test_feature_kernel_is_returned_unchanged():
    base = FourierFeatureKernel(8)
    assert as_feature_kernel(base) is base


# ---------------------------------------------------------------- statistics
@pytest.mark.parametrize("complex_poly", [False, True])
def test_elementwise_product_is_unbiased(complex_poly):
    tree = mixed_tree(width=32, complex_poly=complex_poly)
    k = as_feature_kernel(tree, seed=0)
    assert k.is_complex == complex_poly
    x, y = pairs()
    values = monte_carlo(k, x, y, draws=1500, seed=1)
    z = (values.mean(0) - exact_mixed(x, y)) / (values.std(0) / math.sqrt(values.shape[0]))
    assert z.abs().max() < 4.5, z


def test_elementwise_product_variance_matches_closed_form():
    # Gaussian and Rademacher dense sketches have i.i.d. columns, so the closed form applies.
    width = 16
    a = PolynomialSketchKernel(2, width, bias=0.5, projection="gaussian", active_dims=[0, 1])
    b = PolynomialSketchKernel(1, width, projection="rademacher", active_dims=[2, 3])
    k = as_feature_kernel((a * b).double(), seed=0)
    x, y = pairs(n=3)
    draws = 3000
    values = monte_carlo(k, x, y, draws=draws, seed=2)
    hx = torch.cat([x[:, :2], torch.full((3, 1), 0.5**0.5, dtype=DT)], dim=-1)
    hy = torch.cat([y[:, :2], torch.full((3, 1), 0.5**0.5, dtype=DT)], dim=-1)
    va = sketch_variance(hx, hy, 2, width, projection="gaussian")
    vb = sketch_variance(x[:, 2:], y[:, 2:], 1, width, projection="rademacher")
    ka, kb = polynomial(x[:, :2], y[:, :2], 2, 0.5), polynomial(x[:, 2:], y[:, 2:], 1, 0.0)
    closed = product_variance([ka, kb], [va, vb], width)
    centred = values - values.mean(0)
    empirical = centred.square().mean(0)
    # Standard error of a sample variance: sqrt((m4 - var^2) / n).
    stderr = ((centred**4).mean(0) - empirical.square()).sqrt() / math.sqrt(draws)
    z = (empirical - closed) / stderr
    assert z.abs().max() < 4.5, (empirical, closed, z)
    # The tensor product's variance of the same parts is smaller by (D - 1) va vb.
    tensor = product_variance([ka, kb], [va, vb], width, product="tensor")
    torch.testing.assert_close(closed - tensor, (width - 1) * va * vb)


def test_product_variance_validates():
    k = torch.ones(2)
    with pytest.raises(ValueError, match="equal length"):
        product_variance([k], [k, k], 4)
    with pytest.raises(ValueError, match="non-negative"):
        product_variance([k], [-k], 4)
    with pytest.raises(ValueError, match="product must be one of"):
        product_variance([k], [k], 4, product="outer")
    with pytest.raises(ValueError, match=r"values\[0\] must be finite"):
        product_variance([torch.tensor([math.nan])], [k[:1]], 4)
    with pytest.raises(ValueError, match=r"variances\[0\] must be finite"):
        product_variance([k], [torch.full((2,), math.inf)], 4)
    with pytest.raises(TypeError, match=r"values\[0\] must have a floating dtype"):
        product_variance([torch.ones(2, dtype=torch.long)], [k], 4)
    with pytest.raises(ValueError, match="num_features must be an integer >= 1"):
        product_variance([k], [k], 0)


@pytest.mark.parametrize(
    "x,error,match",
    [
        (torch.tensor([[0.0, math.nan]]), ValueError, "x must be finite"),
        (torch.tensor([[0.0, math.inf]]), ValueError, "x must be finite"),
        (torch.zeros(2, 2, dtype=torch.long), TypeError, "x must have a floating dtype"),
        (torch.tensor(1.0), ValueError, "0-d"),
        (torch.zeros(3, 3), ValueError, "x must have 2 input columns, got 3"),
    ],
    ids=["nan", "inf", "integer", "0-d", "width"],
)
def test_composed_features_reject_bad_inputs(x, error, match):
    k = as_feature_kernel(
        FourierFeatureKernel(8, active_dims=[0]) * FourierFeatureKernel(8, active_dims=[1])
    )
    k.features(torch.zeros(1, 2))  # fixes the input dimension
    with pytest.raises(error, match=match):
        k.features(x)
    assert k.features(torch.zeros(0, 2)).shape == (0, 8)  # no rows: no features, no error


def test_composed_features_name_active_dims_beyond_the_columns():
    k = as_feature_kernel(
        FourierFeatureKernel(8, active_dims=[0]) * FourierFeatureKernel(8, active_dims=[4])
    )
    with pytest.raises(ValueError, match="active_dims must index the 2 columns of x "
                                         r"\(0 to 1\), got the largest index 4"):
        k.features(torch.zeros(3, 2))


# ---------------------------------------------------------------- gradients, state
@pytest.mark.parametrize("product", ["elementwise", "tensor"])
def test_gradients_reach_every_hyperparameter_of_the_tree(product):
    width = 6 if product == "tensor" else 16
    tree = mixed_tree(width=width)
    k = as_feature_kernel(tree, product=product, seed=0)
    x = torch.randn(5, 4, dtype=DT)
    k(x).to_dense().sum().backward()
    named = dict(tree.named_parameters())
    assert set(named) == {
        "kernels.0.raw_outputscale",
        "kernels.0.base_kernel.raw_lengthscale",
        "kernels.1.kernels.0.raw_lengthscale",
        "kernels.1.kernels.1.raw_lengthscale",
        "kernels.1.kernels.1.raw_bias",
    }
    grads = {name: p.grad.clone() for name, p in named.items()}
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
               for g in grads.values())
    if product == "tensor":
        # Real parts: the tensor product is GPyTorch's evaluation, gradients included.
        tree.zero_grad()
        tree(x).to_dense().sum().backward()
        for name, p in tree.named_parameters():
            torch.testing.assert_close(p.grad, grads[name])


def test_parameters_and_weights_are_shared_not_copied():
    tree = mixed_tree()
    k = as_feature_kernel(tree)
    x = torch.randn(4, 4, dtype=DT)
    before = k.features(x)
    tree.kernels[0].outputscale = torch.tensor(4.0, dtype=DT)
    after = k.features(x)
    ratio = (4.0 / 1.7) ** 0.5
    torch.testing.assert_close(after[:, :32], before[:, :32] * ratio, atol=1e-6, rtol=1e-6)
    assert {id(p) for p in k.parameters()} == {id(p) for p in tree.parameters()}


def test_resample_is_reproducible_and_state_dict_round_trips():
    x = torch.randn(4, 4, dtype=DT)
    k = as_feature_kernel(mixed_tree(), seed=0)
    k.features(x)
    k.resample(torch.Generator().manual_seed(5))
    first = k.features(x)
    k.resample(torch.Generator().manual_seed(5))
    torch.testing.assert_close(k.features(x), first, rtol=0, atol=0)
    fresh = as_feature_kernel(mixed_tree(), seed=9)
    fresh.load_state_dict(k.state_dict())
    torch.testing.assert_close(fresh.features(x), first, rtol=0, atol=0)
    clone = pickle.loads(pickle.dumps(k))
    torch.testing.assert_close(clone.features(x), first, rtol=0, atol=0)


@pytest.mark.parametrize("operator", ["sum", "product"])
def test_parts_moved_to_float64_before_composing_make_a_float64_kernel(operator):
    # The composed kernel's own dtype anchor must start where its parts are: a sum of
    # float64 parts is a float64 kernel whose Gram is the sum (product) of theirs.
    fourier = FourierFeatureKernel(32, seed=0).double()
    sketch = PolynomialSketchKernel(2, 32, bias=1.0, seed=1).double()
    tree = fourier + sketch if operator == "sum" else fourier * sketch
    composed = as_feature_kernel(tree)
    assert composed.dtype == DT
    x = torch.rand(6, 2, generator=torch.Generator().manual_seed(0), dtype=DT)
    phi = composed.features(x)
    assert phi.dtype == DT
    grams = [k.features(x) @ k.features(x).T for k in (fourier, sketch)]
    if operator == "sum":
        torch.testing.assert_close(phi @ phi.T, grams[0] + grams[1], rtol=1e-12, atol=1e-12)
    gp = RandomFeatureGP(tree, noise=0.1).fit(x, x[:, 0])
    assert gp.predict(x).dtype == DT


# ---------------------------------------------------------------- errors
def test_rejects_what_has_no_feature_map():
    with pytest.raises(TypeError, match=r"kernel.kernels\[1\] must be an rfgp RandomFeatureKernel"):
        as_feature_kernel(FourierFeatureKernel(8) + RBFKernel())
    with pytest.raises(ValueError, match="equal width, got widths \\[8, 16\\]"):
        as_feature_kernel(FourierFeatureKernel(8) * FourierFeatureKernel(16))
    shared = FourierFeatureKernel(8)
    with pytest.raises(ValueError, match="must be independent"):
        as_feature_kernel(shared * ScaleKernel(shared))
    with pytest.raises(ValueError, match="batch_shape"):
        as_feature_kernel(
            FourierFeatureKernel(8, batch_shape=torch.Size([2])) + FourierFeatureKernel(8)
        )
    with pytest.raises(ValueError, match="product must be one of"):
        as_feature_kernel(FourierFeatureKernel(8) + FourierFeatureKernel(8), product="outer")
    with pytest.raises(ValueError, match="allocation"):
        as_feature_kernel(
            MaclaurinKernel("exponential", 16) + FourierFeatureKernel(8)
        )
    assert isinstance(as_feature_kernel(AdditiveKernel(FourierFeatureKernel(8))),
                      ComposedFeatureKernel)


# ---------------------------------------------------------------- solvers
def test_random_feature_gp_accepts_a_kernel_tree():
    tree = mixed_tree(width=16)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 4, generator=g, dtype=DT)
    y = torch.sin(3 * x[:, 0]) * x[:, 3] + 0.1 * torch.randn(40, generator=g, dtype=DT)
    gp = RandomFeatureGP(tree, noise=0.05).fit(x, y)
    xs = torch.rand(6, 4, generator=g, dtype=DT)
    # The weight-space posterior mean equals the dense function-space formula with the
    # composition's Gram matrix (push-through identity).
    k = gp.kernel
    with torch.no_grad():
        gram = k(x).to_dense()
        cross = k(xs, x).to_dense()
    expected = cross @ torch.linalg.solve(gram + 0.05 * torch.eye(40, dtype=DT), y)
    torch.testing.assert_close(gp.predict(xs), expected)
    assert {id(p) for p in gp.parameters()} >= {id(p) for p in tree.parameters()}


def test_classifier_accepts_a_kernel_tree():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(60, 3, generator=g, dtype=DT)
    labels = (x[:, 0] + x[:, 1] > 1).long()
    tree = FourierFeatureKernel(32, active_dims=[0, 1], seed=0) + FourierFeatureKernel(
        32, active_dims=[2], seed=1
    )
    clf = DirichletGPClassifier(tree.double()).fit(x, labels)
    assert (clf.predict(x) == labels).double().mean() > 0.8


def test_gpytorch_exact_gp_trains_with_a_composed_kernel():
    tree = mixed_tree(width=16)
    k = as_feature_kernel(tree)
    x = torch.rand(30, 4, dtype=DT)
    y = torch.sin(4 * x[:, 0])

    class GP(gpytorch.models.ExactGP):
        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(
                torch.zeros(inputs.shape[:-1], dtype=DT), k(inputs)
            )

    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    model = GP(x, y, lik).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    loss = -mll(model(x), y)
    loss.backward()
    assert all(p.grad is not None for p in tree.parameters())


def test_a_changed_tree_parameter_is_never_stale_in_the_solver():
    tree = mixed_tree(width=16)
    g = torch.Generator().manual_seed(2)
    x = torch.rand(30, 4, generator=g, dtype=DT)
    y = torch.cos(3 * x[:, 1])
    gp = RandomFeatureGP(tree, noise=0.1).fit(x, y)
    xs = torch.rand(5, 4, generator=g, dtype=DT)
    before = gp.predict(xs)
    tree.kernels[1].kernels[0].lengthscale = torch.tensor(0.3, dtype=DT)  # a leaf deep inside
    after = gp.predict(xs)
    fresh = RandomFeatureGP(gp.kernel, noise=0.1).fit(x, y).predict(xs)
    torch.testing.assert_close(after, fresh)
    assert not torch.allclose(after, before)


def test_a_kernel_tree_assigned_to_the_solver_becomes_one_feature_map():
    gp = RandomFeatureGP(FourierFeatureKernel(8, seed=0).double(), noise=0.1)
    tree = mixed_tree(width=8)
    gp.kernel = tree
    assert isinstance(gp.kernel, ComposedFeatureKernel) and gp.kernel.tree is tree
    x = torch.rand(12, 4, dtype=DT)
    assert gp.fit(x, x[:, 0]).predict(x).shape == (12,)


# ---------------------------------------------------------------- variance correction
def corrected_tree(width=32):
    """poly(dims 2, 3) * Gaussian sketch(dims 0, 1) + scale * Gaussian sketch(dims 0, 1)."""
    from rfgp.kernels import GaussianSketchKernel

    poly = PolynomialSketchKernel(2, width, bias=0.5, projection="gaussian", active_dims=[2, 3],
                                  seed=3)
    sketch = GaussianSketchKernel(width, truncation=2, active_dims=[0, 1], seed=4)
    sketch.lengthscale = torch.tensor(0.7)
    other = GaussianSketchKernel(width, truncation=3, active_dims=[0, 1], seed=5)
    scaled = ScaleKernel(other)
    scaled.outputscale = torch.tensor(1.5)
    return (poly * sketch + scaled).double(), poly, sketch, other


def test_composed_variance_correction_is_built_from_the_parts():
    tree, poly, sketch, other = corrected_tree()
    k = as_feature_kernel(tree, seed=0)
    assert k.has_variance_correction
    x = pairs(n=6)[0]
    with torch.no_grad():
        k_poly = polynomial(x[:, 2:], x[:, 2:], 2, 0.5)
        expected = k_poly * sketch.variance_correction(x) + 1.5 * other.variance_correction(x)
        torch.testing.assert_close(k.variance_correction(x), expected)
    assert (expected > 1e-3).all()  # truncation 2 and 3 leave a visible bias
    assert not as_feature_kernel(mixed_tree()).has_variance_correction
    torch.testing.assert_close(as_feature_kernel(mixed_tree()).variance_correction(x),
                               torch.zeros(6, dtype=DT))


def test_composed_estimate_plus_correction_is_the_exact_diagonal():
    # E[k_hat(x, x)] + c(x) = k(x, x): the Gaussian sketches are biased, the correction is not.
    tree, *_ = corrected_tree(width=16)
    k = as_feature_kernel(tree, seed=0)
    x = pairs(n=4)[0]
    with torch.no_grad():
        exact = polynomial(x[:, 2:], x[:, 2:], 2, 0.5) + 1.5
        values = monte_carlo(k, x, x, draws=600, seed=2) + k.variance_correction(x)
    z = (values.mean(0) - exact) / (values.std(0) / math.sqrt(values.shape[0]))
    assert z.abs().max() < 4.5, z
    biased = monte_carlo(k, x, x, draws=600, seed=2)
    z_biased = (biased.mean(0) - exact) / (biased.std(0) / math.sqrt(biased.shape[0]))
    assert z_biased.abs().min() > 4.5, z_biased  # without the correction the bias shows


def test_solver_adds_the_composed_correction_to_the_variance():
    tree, *_ = corrected_tree()
    g = torch.Generator().manual_seed(0)
    x = 0.6 * torch.randn(30, 4, generator=g, dtype=DT)
    y = torch.sin(x.sum(-1))
    xs = 0.6 * torch.randn(5, 4, generator=g, dtype=DT)
    k = as_feature_kernel(tree, seed=0)  # one feature map (permutations) for both models
    plain = RandomFeatureGP(k, noise=0.1).fit(x, y)
    corrected = RandomFeatureGP(k, noise=0.1, correct_variance=True).fit(x, y)
    with torch.no_grad():
        _, s0 = plain.predict(xs, return_std=True)
        _, s1 = corrected.predict(xs, return_std=True)
        correction = k.variance_correction(xs)
    torch.testing.assert_close(s1.square() - s0.square(), correction)
