"""Tests of the Dirichlet transform, likelihood and classifier (Milios et al., 2018)."""

import math

import gpytorch
import numpy as np
import pytest
import torch

from rfgp import DirichletGPClassifier, metrics
from rfgp.inference.dirichlet import (
    ALPHA_GRID,
    DirichletExactGP,
    dirichlet_transform,
    softmax_expectation,
    validate_labels,
)
from rfgp.kernels import FourierFeatureKernel, PolynomialSketchKernel, RandomFeatureKernel
from rfgp.likelihoods import DirichletLikelihood

DTYPE = torch.float64


def blobs(n_per_class, centres, spread, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.as_tensor(centres, dtype=DTYPE)
    xs, ys = [], []
    for c, centre in enumerate(centres):
        xs.append(centre + spread * torch.randn(n_per_class, centres.shape[1], generator=g,
                                                dtype=DTYPE))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    x, y = torch.cat(xs), torch.cat(ys)
    perm = torch.randperm(x.shape[0], generator=g)
    return x[perm], y[perm]


THREE_CENTRES = [[0.0, 0.0], [2.0, 0.0], [1.0, 1.7]]


# ------------------------------------------------------------------------------ transform
# (alpha, y=1 noise, y=1 target, y=0 noise, y=0 target), from the closed form in the digest.
TABLE = [
    (1e-5, 0.693142, -0.346561, 11.512935, -17.269393),
    (1e-4, 0.693097, -0.346449, 9.210440, -13.815561),
    (1e-3, 0.692648, -0.345324, 6.908755, -10.362133),
    (1e-2, 0.688184, -0.334142, 4.615121, -6.912730),
    (1e-1, 0.646627, -0.228003, 2.397895, -3.501533),
    (1.0, 0.405465, 0.490415, 0.693147, -0.346574),
]


@pytest.mark.parametrize("alpha, s1, y1, s0, y0", TABLE)
def test_transform_matches_table(alpha, s1, y1, s0, y0):
    targets, noise = dirichlet_transform(torch.tensor([1, 0]), 2, alpha)
    # row 0 has label 1: column 1 is the positive class
    assert targets.shape == noise.shape == (2, 2)
    torch.testing.assert_close(noise[0], torch.tensor([s0, s1], dtype=DTYPE), atol=1e-6, rtol=0)
    torch.testing.assert_close(targets[0], torch.tensor([y0, y1], dtype=DTYPE), atol=1e-6, rtol=0)
    torch.testing.assert_close(noise[1], torch.tensor([s1, s0], dtype=DTYPE), atol=1e-6, rtol=0)


@pytest.mark.parametrize("alpha", ALPHA_GRID)
def test_transform_moment_matches_gamma(alpha):
    labels = torch.tensor([0, 1, 2, 2, 1])
    targets, noise = dirichlet_transform(labels, 4, alpha)
    conc = torch.nn.functional.one_hot(labels, 4).to(DTYPE) + alpha
    # log-normal mean and variance equal the Gamma(conc, 1) mean and variance
    torch.testing.assert_close(torch.exp(targets + noise / 2), conc, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.expm1(noise) * torch.exp(2 * targets + noise), conc,
                               rtol=1e-10, atol=0)
    # absent class (3) is kept; negatives are noisier than positives for alpha < 1
    assert (targets[:, 3] == targets[0, 1]).all()
    if alpha < 1:
        assert (noise[conc < 1] > noise[conc > 1].max()).all()


def test_likelihood_targets_noise_and_centring():
    labels = torch.tensor([0, 2, 2, 1, 0, 0])
    lik = DirichletLikelihood(num_classes=4, alpha_epsilon=0.1, centre=False)
    targets = lik.set_train_labels(labels)
    ref_t, ref_s = dirichlet_transform(labels, 4, 0.1)
    torch.testing.assert_close(targets, ref_t.T)
    torch.testing.assert_close(lik.noise, ref_s.T)
    assert (lik.class_offsets == 0).all()
    lik_c = DirichletLikelihood(num_classes=4, alpha_epsilon=0.1, centre=True)
    centred = lik_c.set_train_labels(labels)
    torch.testing.assert_close(centred.mean(-1), torch.zeros(4, dtype=DTYPE), atol=1e-14, rtol=0)
    torch.testing.assert_close(centred + lik_c.class_offsets.unsqueeze(-1), ref_t.T)


def test_likelihood_noise_used_by_gpytorch_marginal():
    labels = torch.tensor([0, 1, 1, 0])
    lik = DirichletLikelihood(2, alpha_epsilon=0.01, labels=labels)
    mvn = gpytorch.distributions.MultivariateNormal(
        torch.zeros(2, 4, dtype=DTYPE), torch.eye(4, dtype=DTYPE).expand(2, 4, 4)
    )
    marginal = lik(mvn)
    torch.testing.assert_close(marginal.variance, 1 + lik.noise)
    with pytest.raises(ValueError, match="training"):
        lik(gpytorch.distributions.MultivariateNormal(
            torch.zeros(2, 3, dtype=DTYPE), torch.eye(3, dtype=DTYPE).expand(2, 3, 3)))
    with pytest.raises(RuntimeError, match="set_train_labels"):
        DirichletLikelihood(2)(mvn)


# ------------------------------------------------------------------------------ labels
@pytest.mark.parametrize(
    "labels, num_classes, error, match",
    [
        (torch.tensor([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (np.array([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (torch.tensor([True, False]), 2, TypeError, "labels.*integer"),
        ([0, 1], 2, TypeError, "labels must be a torch.Tensor"),
        (torch.tensor([0, -1, 1]), 2, ValueError, "labels.*non-negative.*-1"),
        (torch.tensor([0, 1, 3]), 3, ValueError, "labels must be < num_classes = 3, got maximum 3"),
        (torch.tensor([2, 2, 2]), 3, ValueError, "labels.*two distinct classes"),
        (torch.tensor([0, 0]), None, ValueError, "labels.*single class"),
        (torch.tensor([[0, 1]]), 2, ValueError, r"labels.*shape \(N,\)"),
        (torch.tensor([], dtype=torch.long), 2, ValueError, "labels.*empty"),
        (torch.tensor([0, 1]), 1, ValueError, "num_classes must be >= 2"),
    ],
)
def test_bad_labels(labels, num_classes, error, match):
    with pytest.raises(error, match=match):
        validate_labels(labels, num_classes)
    x = torch.zeros(len(labels), 1, dtype=DTYPE) if hasattr(labels, "__len__") else None
    if num_classes is not None and num_classes < 2:
        with pytest.raises(error, match=match):
            DirichletGPClassifier(gpytorch.kernels.RBFKernel(), num_classes=num_classes)
        return
    clf = DirichletGPClassifier(gpytorch.kernels.RBFKernel(), num_classes=num_classes)
    with pytest.raises(error, match=match):
        clf.fit(x, labels)


def test_validate_labels_accepts_numpy_and_infers_classes():
    labels, c = validate_labels(np.array([3, 0, 1], dtype=np.int32))
    assert c == 4 and labels.dtype == torch.long


def test_bad_arguments():
    with pytest.raises(ValueError, match="alpha_epsilon"):
        DirichletLikelihood(3, alpha_epsilon=0.0)
    with pytest.raises(TypeError, match="alpha_epsilon"):
        DirichletGPClassifier(gpytorch.kernels.RBFKernel(), alpha_epsilon="small")
    with pytest.raises(ValueError, match="outputscale"):
        DirichletGPClassifier(gpytorch.kernels.RBFKernel(), outputscale=-1.0)
    with pytest.raises(TypeError, match="kernel"):
        DirichletGPClassifier("rbf")
    clf = DirichletGPClassifier(gpytorch.kernels.RBFKernel())
    with pytest.raises(RuntimeError, match="not fitted"):
        clf.predict_proba(torch.zeros(2, 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="labels must have one entry per row of x"):
        clf.fit(torch.zeros(3, 1, dtype=DTYPE), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="method"):
        softmax_expectation(torch.zeros(2, 2), torch.ones(2, 2), method="probit")
    with pytest.raises(ValueError, match="validation_fraction"):
        clf.select_alpha(torch.zeros(4, 1, dtype=DTYPE), torch.tensor([0, 1, 0, 1]),
                         validation_fraction=1.5)


# ------------------------------------------------------------------------------ E[softmax]
def _quadrature_binary(mean, var, nodes=200):
    # E[sigmoid(f_1 - f_0)] with f_1 - f_0 ~ N(m, v), by Gauss-Hermite quadrature.
    t, w = np.polynomial.hermite.hermgauss(nodes)
    t = torch.as_tensor(t, dtype=DTYPE)
    w = torch.as_tensor(w, dtype=DTYPE) / math.sqrt(math.pi)
    m = (mean[:, 1] - mean[:, 0]).unsqueeze(-1)
    s = (var[:, 0] + var[:, 1]).sqrt().unsqueeze(-1)
    return (torch.sigmoid(m + math.sqrt(2) * s * t) * w).sum(-1)


def _latents(m, c, max_var, seed):
    g = torch.Generator().manual_seed(seed)
    mean = -7 * torch.rand(m, c, generator=g, dtype=DTYPE)
    var = max_var * torch.rand(m, c, generator=g, dtype=DTYPE)
    return mean, var


def test_mc_probabilities_unbiased_against_quadrature():
    mean, var = _latents(50, 2, 4.0, seed=1)
    exact = _quadrature_binary(mean, var)
    num_samples = 4000
    p = softmax_expectation(mean, var, "mc", num_samples, torch.Generator().manual_seed(2))
    # standard error of an average of S values in [0, 1]: at most 0.5 / sqrt(S)
    assert ((p[:, 1] - exact).abs() < 5 * 0.5 / math.sqrt(num_samples)).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(50, dtype=DTYPE))


def test_mc_variance_decreases_with_samples():
    mean, var = _latents(1, 3, 2.0, seed=3)
    spreads = []
    for s in (100, 1600):
        draws = torch.stack([
            softmax_expectation(mean, var, "mc", s, torch.Generator().manual_seed(r))
            for r in range(40)
        ])
        spreads.append(draws.std(0).max())
    # standard error falls like 1 / sqrt(S): a factor 4 here
    assert spreads[0] / spreads[1] > 2.5


def test_mc_is_deterministic_with_generator():
    mean, var = _latents(5, 3, 1.0, seed=4)
    a = softmax_expectation(mean, var, "mc", 100, torch.Generator().manual_seed(7))
    b = softmax_expectation(mean, var, "mc", 100, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["mc", "mean_field", "lognormal"])
def test_zero_variance_gives_softmax(method):
    mean, _ = _latents(6, 4, 1.0, seed=5)
    p = softmax_expectation(mean, torch.zeros_like(mean), method, 10)
    torch.testing.assert_close(p, torch.softmax(mean, -1))


def test_mean_field_error_binary_against_quadrature():
    # C = 2: the mean-field rule is the probit approximation of E[sigmoid]; documented error
    # about 0.012 (max) for latent variances up to 4.
    mean, var = _latents(400, 2, 4.0, seed=6)
    exact = _quadrature_binary(mean, var)
    approx = softmax_expectation(mean, var, "mean_field")[:, 1]
    lognormal = softmax_expectation(mean, var, "lognormal")[:, 1]
    assert (approx - exact).abs().max() < 0.02
    assert (approx - exact).abs().mean() < 0.006
    assert (lognormal - exact).abs().mean() > 5 * (approx - exact).abs().mean()


def test_mean_field_error_ten_classes_against_mc():
    mean, var = _latents(100, 10, 1.0, seed=7)
    num_samples = 10000
    ref = softmax_expectation(mean, var, "mc", num_samples, torch.Generator().manual_seed(8))
    stderr = 0.5 / math.sqrt(num_samples)
    err = (softmax_expectation(mean, var, "mean_field") - ref).abs()
    err_ln = (softmax_expectation(mean, var, "lognormal") - ref).abs()
    # documented: mean abs error about 0.007 and max about 0.06 for variances up to 1
    assert err.mean() < 0.01 + stderr
    assert err.max() < 0.08 + 5 * stderr
    assert err.mean() < err_ln.mean()


# ------------------------------------------------------------------------------ exact path
class _BatchExactModel(gpytorch.models.ExactGP):
    """The GPyTorch recipe: C independent GPs with a batch-shaped kernel."""

    def __init__(self, x, targets, likelihood, lengthscale):
        super().__init__(x, targets, likelihood)
        c = targets.shape[0]
        self.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([c]))
        self.covar_module = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([c]))
        self.covar_module.lengthscale = lengthscale

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def _gpytorch_exact(x, labels, x_test, alpha, lengthscale, num_classes=3):
    lik = DirichletLikelihood(num_classes, alpha_epsilon=alpha, centre=True)
    targets = lik.set_train_labels(labels)
    model = _BatchExactModel(x, targets, lik, lengthscale).double().eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False), \
            gpytorch.settings.max_cholesky_size(10**6):
        post = model(x_test)
    mean = post.mean.T + lik.class_offsets
    return mean, post.variance.T, lik, post


def _rbf(lengthscale):
    k = gpytorch.kernels.RBFKernel().double()
    k.lengthscale = lengthscale
    return k


def test_exact_classifier_matches_gpytorch_batch_model():
    x, y = blobs(15, THREE_CENTRES, 0.6, seed=10)
    xt, _ = blobs(5, THREE_CENTRES, 0.6, seed=11)
    mean, var, lik, post = _gpytorch_exact(x, y, xt, 0.05, 0.8)
    clf = DirichletGPClassifier(_rbf(0.8), alpha_epsilon=0.05, outputscale=1.0).fit(x, y)
    latent = clf.latent_posterior(xt)
    # GPyTorch's RBF forms squared distances as |x|^2 + |y|^2 - 2 x^T y: ~1e-8 round-off in K
    torch.testing.assert_close(latent.mean, mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(latent.variance, var, rtol=1e-6, atol=1e-6)
    # the likelihood turns GPyTorch's batch posterior into the same probabilities
    p_lik = lik.class_probabilities(post, method="mean_field")
    torch.testing.assert_close(clf.predict_proba(xt, method="mean_field"), p_lik)


def test_dirichlet_exact_gp_model():
    x, y = blobs(10, THREE_CENTRES, 0.6, seed=12)
    lik = DirichletLikelihood(3, alpha_epsilon=0.05, labels=y)
    model = DirichletExactGP(x, lik, _rbf(0.8)).double()
    # training mode: the exact marginal log likelihood runs with the heteroscedastic noise
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    model.train()
    value = mll(model(x), lik.train_targets).sum()
    k = _rbf(0.8)(x).to_dense()
    ref = sum(
        torch.distributions.MultivariateNormal(
            torch.zeros(30, dtype=DTYPE), k + torch.diag(lik.noise[c])
        ).log_prob(lik.train_targets[c])
        for c in range(3)
    ) / 30
    torch.testing.assert_close(value, ref)


# ------------------------------------------------------------------------------ RF path
class _ExactFactorKernel(RandomFeatureKernel):
    """Features = rows of a factor of a fixed Gram matrix; the last input column is the row id."""

    def __init__(self, factor):
        super().__init__(num_features=factor.shape[1])
        self.register_buffer("factor", factor)

    def _sample_weights(self, input_dim, generator):
        return {}

    def _features(self, x):
        return self.factor[x[..., -1].round().long()]


def test_exact_features_reproduce_exact_posterior_and_evidence():
    # With Phi Phi^T = K on train and test points the weight-space solve is the exact GP.
    x, y = blobs(12, THREE_CENTRES, 0.6, seed=13)
    xt, _ = blobs(4, THREE_CENTRES, 0.6, seed=14)
    allx = torch.cat([x, xt])
    k = _rbf(0.8)(allx).to_dense()
    evals, evecs = torch.linalg.eigh(k)
    factor = evecs * evals.clamp_min(0).sqrt()
    ids = torch.arange(allx.shape[0], dtype=DTYPE).unsqueeze(-1)
    for solve in ("weight", "function"):
        clf_rf = DirichletGPClassifier(_ExactFactorKernel(factor), alpha_epsilon=0.01,
                                       solve=solve).fit(ids[:36], y)
        clf_ex = DirichletGPClassifier(_rbf(0.8), alpha_epsilon=0.01).fit(x, y)
        a, b = clf_rf.latent_posterior(ids[36:]), clf_ex.latent_posterior(xt)
        # K itself carries ~1e-8 round-off from GPyTorch's distance computation
        torch.testing.assert_close(a.mean, b.mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a.variance, b.variance, rtol=1e-6, atol=1e-6)
        # evidence: sum_c log N(y_c; 0, s^2 K + diag(noise_c)) with the auto outputscale
        lik = clf_ex.likelihood
        s2 = clf_ex.outputscale_
        ref = sum(
            torch.distributions.MultivariateNormal(
                torch.zeros(36, dtype=DTYPE), s2 * k[:36, :36] + torch.diag(lik.noise[c])
            ).log_prob(lik.train_targets[c])
            for c in range(3)
        )
        assert clf_rf.log_marginal_likelihood() == pytest.approx(float(ref.detach()), rel=1e-7)
        assert clf_ex.log_marginal_likelihood() == pytest.approx(float(ref.detach()), rel=1e-7)


def test_large_d_matches_gpytorch_exact_dirichlet_gp():
    """RFF posterior vs GPyTorch's exact Dirichlet GP, within a first-order perturbation bound.

    For A = K + S, mu = k_*^T A^{-1} y and var = k_** - k_*^T A^{-1} k_*, a kernel error E
    changes them to first order by at most
    |dmu| <= ||dk_*|| ||A^{-1} y|| + ||A^{-1} k_*|| ||E_train||_2 ||A^{-1} y|| and
    |dvar| <= |dk_**| + 2 ||dk_*|| ||A^{-1} k_*|| + ||A^{-1} k_*||^2 ||E_train||_2;
    the test allows twice that (second-order terms), with E measured on the drawn features.
    """
    x, y = blobs(20, THREE_CENTRES, 0.6, seed=15)
    xt, _ = blobs(6, THREE_CENTRES, 0.6, seed=16)
    ls, alpha = 0.8, 0.05
    mean, var, lik, _ = _gpytorch_exact(x, y, xt, alpha, ls)
    kernel = FourierFeatureKernel(8192, seed=0).double()
    kernel.lengthscale = ls
    clf = DirichletGPClassifier(kernel, alpha_epsilon=alpha, outputscale=1.0).fit(x, y)
    latent = clf.latent_posterior(xt)

    allx = torch.cat([x, xt])
    k_exact = _rbf(ls)(allx).to_dense()
    phi = kernel.features(allx)
    err = phi @ phi.T - k_exact
    n = x.shape[0]
    e_train = torch.linalg.matrix_norm(err[:n, :n], ord=2)
    for c in range(3):
        a = k_exact[:n, :n] + torch.diag(lik.noise[c])
        a_inv_y = torch.linalg.solve(a, lik.train_targets[c])
        a_inv_k = torch.linalg.solve(a, k_exact[:n, n:])  # (n, m)
        dk = err[:n, n:].norm(dim=0)
        ak = a_inv_k.norm(dim=0)
        bound_mean = dk * a_inv_y.norm() + ak * e_train * a_inv_y.norm()
        bound_var = err[n:, n:].diagonal().abs() + 2 * dk * ak + ak**2 * e_train
        assert ((latent.mean[:, c] - mean[:, c]).abs() <= 2 * bound_mean).all()
        assert ((latent.variance[:, c] - var[:, c]).abs() <= 2 * bound_var).all()
    # and the bound itself is small: the RFF error of 4096 frequencies is ~ 1/sqrt(4096)
    assert (latent.mean - mean).abs().max() < 0.1
    assert (latent.variance - var).abs().max() < 0.05


def test_error_shrinks_with_num_features():
    x, y = blobs(20, THREE_CENTRES, 0.6, seed=17)
    xt, _ = blobs(10, THREE_CENTRES, 0.6, seed=18)
    mean, var, _, _ = _gpytorch_exact(x, y, xt, 0.05, 0.8)
    errors = {}
    for d in (64, 4096):
        per_seed = []
        for seed in range(6):
            kernel = FourierFeatureKernel(d, seed=seed).double()
            kernel.lengthscale = 0.8
            clf = DirichletGPClassifier(kernel, alpha_epsilon=0.05, outputscale=1.0).fit(x, y)
            per_seed.append((clf.latent_posterior(xt).mean - mean).pow(2).mean())
        errors[d] = torch.stack(per_seed).mean()
    # mean squared error ~ 1 / D: a factor 64 in expectation; ask for 10
    assert errors[64] / errors[4096] > 10


@pytest.mark.parametrize("complex_features", [False, True])
@pytest.mark.parametrize("projection", ["rademacher", "tensorsrht"])
def test_probabilities_valid_with_polynomial_sketches(complex_features, projection):
    x, y = blobs(15, THREE_CENTRES, 0.4, seed=19)
    x = torch.nn.functional.normalize(x + 1.0, dim=-1)
    kernel = PolynomialSketchKernel(3, 64, bias=1.0, projection=projection,
                                    complex=complex_features, seed=0).double()
    clf = DirichletGPClassifier(kernel, seed=0, num_samples=200).fit(x, y)
    for method in ("mc", "mean_field", "lognormal"):
        p = clf.predict_proba(x, method=method)
        assert p.shape == (45, 3)
        assert ((p >= 0) & (p <= 1)).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(45, dtype=DTYPE))
    assert clf.gp.base_kernel.is_complex == complex_features


def test_separated_data_is_accurate_and_confident():
    centres = [[-4.0, 0.0], [4.0, 0.0], [0.0, 6.0]]
    x, y = blobs(30, centres, 0.5, seed=20)
    xt, yt = blobs(20, centres, 0.5, seed=21)
    kernel = FourierFeatureKernel(512, seed=0).double()
    kernel.lengthscale = 2.0
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.01, seed=0).fit(x, y)
    p = clf.predict_proba(xt)
    assert metrics.accuracy(p, yt) == 1.0
    assert p.max(-1).values.min() > 0.8
    assert p.max(-1).values.mean() > 0.9
    assert torch.equal(clf.predict(xt), yt)


def test_absent_class_is_kept():
    x, y = blobs(15, THREE_CENTRES[:2], 0.4, seed=22)
    clf = DirichletGPClassifier(_rbf(1.0), num_classes=4, seed=0).fit(x, y)
    p = clf.predict_proba(x, method="mean_field")
    assert p.shape == (30, 4)
    # classes 2 and 3 never occur: their probability stays far below the observed ones
    assert (p[:, 2:] < 0.05).all()


def test_mc_prediction_deterministic_with_seed():
    x, y = blobs(10, THREE_CENTRES, 0.6, seed=23)
    clf = DirichletGPClassifier(_rbf(1.0), seed=3, num_samples=50).fit(x, y)
    assert torch.equal(clf.predict_proba(x), clf.predict_proba(x))


def test_select_alpha_picks_minimum_validation_mnll():
    x, y = blobs(25, THREE_CENTRES, 0.7, seed=24)
    kernel = FourierFeatureKernel(256, seed=0).double()
    clf = DirichletGPClassifier(kernel, seed=0)
    clf.select_alpha(x, y, alphas=(1e-3, 1e-2, 1e-1), lengthscales=(0.5, 1.0, 3.0),
                     validation_fraction=0.2, seed=1)
    rows = clf.selection_
    assert len(rows) == 9
    best = min(rows, key=lambda r: r["mnll"])
    assert [r for r in rows if r["selected"]] == [best]
    assert clf.alpha_epsilon == best["alpha_epsilon"]
    assert kernel.lengthscale.item() == pytest.approx(best["lengthscale"])
    assert clf.gp.num_data == 75  # refitted on all data
    # marginal likelihood picks the lengthscale per alpha; alpha still by validation MNLL
    clf.select_alpha(x, y, alphas=(1e-2, 1e-1), lengthscales=(0.5, 1.0, 3.0),
                     lengthscale_criterion="marginal_likelihood", seed=1)
    rows = clf.selection_
    chosen = [r for r in rows if r["selected"]][0]
    same_alpha = [r for r in rows if r["alpha_epsilon"] == chosen["alpha_epsilon"]]
    assert chosen["log_marginal_likelihood"] == max(r["log_marginal_likelihood"]
                                                    for r in same_alpha)


def test_likelihood_with_random_feature_gp_directly():
    from rfgp import RandomFeatureGP

    x, y = blobs(12, THREE_CENTRES, 0.6, seed=25)
    kernel = FourierFeatureKernel(128, seed=0).double()
    lik = DirichletLikelihood(3, alpha_epsilon=0.1, centre=False)
    targets, noise = lik.transform_labels(y)
    gp = RandomFeatureGP(kernel).fit(x, targets.T, noise=noise.T)
    probs = lik.class_probabilities(gp.posterior(x), method="mean_field")
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.1, centre=False, outputscale=1.0).fit(x, y)
    torch.testing.assert_close(probs, clf.predict_proba(x, method="mean_field"))


@pytest.mark.parametrize("complex_features", [False, True])
def test_shared_gram_fit_equals_one_fit_per_class(complex_features):
    # The classifier's fit accumulates one shared Gram plus one product over each class's own
    # rows; fitting each class alone takes the generic weighted product. Both are exact.
    from rfgp import RandomFeatureGP

    x, y = blobs(150, THREE_CENTRES + [[1.0, -1.5]], 0.7, seed=26)
    if complex_features:
        kernel = PolynomialSketchKernel(3, 64, bias=1.0, complex=True, seed=0).double()
    else:
        kernel = FourierFeatureKernel(128, seed=0).double()
    clf = DirichletGPClassifier(kernel, alpha_epsilon=0.01, solve="weight").fit(x, y)
    assert clf.gp.factorization_groups == [[0], [1], [2], [3]]
    targets = clf.likelihood.transform_labels(y)[0] - clf.likelihood.class_offsets.unsqueeze(-1)
    noise = clf.likelihood.noise
    s2 = clf.outputscale_
    xt = x[:40]
    for c in range(4):
        gp = RandomFeatureGP(kernel, solve="weight").fit(
            x, targets[c] / math.sqrt(s2), noise=noise[c] / s2
        )
        mean, std = gp.predict(xt, return_std=True)
        mean_all, std_all = clf.gp.predict(xt, return_std=True)
        torch.testing.assert_close(mean_all[:, c], mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(std_all[:, c], std, rtol=1e-10, atol=1e-10)
