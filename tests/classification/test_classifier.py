"""Tests of the Dirichlet GP classifier (Milios et al., 2018): exact and random-feature paths."""

import math

import gpytorch
import numpy as np
import pytest
import torch

from rfgp import DirichletGPClassifier, metrics
from rfgp.classification import DirichletExactGP, encode_labels
from rfgp.kernels import (
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    FourierFeatureKernel,
    PolynomialSketchKernel,
    RandomFeatureKernel,
)
from rfgp.likelihoods import DirichletLikelihood
from tests.classification.data import DTYPE, THREE_CENTRES, blobs
from tests.classification.data import rbf as _rbf


# ------------------------------------------------------------------------------ labels
@pytest.mark.parametrize(
    "labels, num_classes, error, match",
    [
        (torch.tensor([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (torch.tensor([0.0, 1.0]), None, TypeError, "labels.*integer"),
        (np.array([0.0, 1.0]), 2, TypeError, "labels.*integer"),
        (torch.tensor([True, False]), 2, TypeError, "labels.*integer"),
        ([0, 1], 2, TypeError, "labels must be a torch.Tensor"),
        (np.array(["a", "b"]), None, TypeError, "labels must hold integer class ids.*encode"),
        (torch.tensor([0, -1, 1]), 2, ValueError, "labels.*non-negative.*-1"),
        (torch.tensor([0, 1, 3]), 3, ValueError, "labels must be < num_classes = 3, got maximum 3"),
        (torch.tensor([2, 2, 2]), 3, ValueError, "labels.*two distinct classes"),
        (torch.tensor([0, 0]), None, ValueError, "labels.*two distinct classes"),
        (torch.tensor([[0, 1]]), 2, ValueError, r"labels.*shape \(N,\)"),
        (torch.tensor([], dtype=torch.long), 2, ValueError, "labels.*empty"),
        (torch.tensor([0, 1]), 1, ValueError, "num_classes must be an integer >= 2"),
    ],
)
def test_bad_labels(labels, num_classes, error, match):
    x = torch.zeros(len(labels), 1, dtype=DTYPE) if hasattr(labels, "__len__") else None
    if num_classes is not None and num_classes < 2:
        with pytest.raises(error, match=match):
            DirichletGPClassifier(gpytorch.kernels.RBFKernel(), num_classes=num_classes)
        return
    clf = DirichletGPClassifier(gpytorch.kernels.RBFKernel(), num_classes=num_classes)
    with pytest.raises(error, match=match):
        clf.fit(x, labels)


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
        clf.predict_proba(torch.zeros(2, 1, dtype=DTYPE), method="probit")
    with pytest.raises(ValueError, match="validation_fraction"):
        clf.select_alpha(torch.zeros(4, 1, dtype=DTYPE), torch.tensor([0, 1, 0, 1]),
                         validation_fraction=1.5)

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


# ------------------------------------------------------------------------------ labels as ids
@pytest.mark.parametrize("kernel", ["exact", "rff"])
def test_arbitrary_integer_ids_map_to_classes_like_sklearn(kernel):
    # ids {0, 10**6} make two classes (not 10**6 + 1); negative ids are ids like any other.
    x, y = blobs(10, THREE_CENTRES[:2], 0.4, seed=30)
    make = (lambda: _rbf(1.0)) if kernel == "exact" else (
        lambda: FourierFeatureKernel(128, seed=0).double())
    for ids in (torch.tensor([0, 10**6]), torch.tensor([-5, 3]), np.array([7, 2])):
        labels = torch.as_tensor(ids)[y]
        clf = DirichletGPClassifier(make(), seed=0).fit(x, ids[y.numpy()] if
                                                         isinstance(ids, np.ndarray) else labels)
        assert torch.equal(clf.classes_, torch.as_tensor(ids).sort().values)
        assert clf.num_classes_ == 2
        p = clf.predict_proba(x, method="mean_field")
        assert p.shape == (20, 2)
        # the probabilities are those of a fit to the indices 0 / 1 in sorted-id order
        ref = DirichletGPClassifier(make(), seed=0).fit(x, (labels == labels.max()).long())
        torch.testing.assert_close(p, ref.predict_proba(x, method="mean_field"))
        assert torch.equal(clf.predict(x, method="mean_field"),
                           clf.classes_[ref.predict(x, method="mean_field")])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32])
def test_unsigned_and_small_integer_ids_keep_their_values_and_dtype(dtype):
    # The largest ids of each dtype (2**64 - 1 for uint64) would wrap in a cast to int64.
    info = np.iinfo(dtype)
    ids = np.array([info.max, info.min, info.max // 2 + 5], dtype=dtype)
    idx, classes = encode_labels(ids[[0, 1, 2, 2, 0]])
    assert classes.dtype == torch.from_numpy(ids).dtype
    assert [int(c) for c in classes.numpy()] == sorted(int(i) for i in ids)
    order = np.argsort(ids)
    assert idx.dtype == torch.long
    assert idx.tolist() == [int(np.where(order == k)[0][0]) for k in (0, 1, 2, 2, 0)]


def test_classifier_predicts_uint64_ids_beyond_int64():
    x, y = blobs(10, THREE_CENTRES, 0.3, seed=31)
    ids = np.array([0, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    clf = DirichletGPClassifier(FourierFeatureKernel(128, seed=0).double(), seed=0)
    clf.fit(x, ids[y.numpy()])
    assert clf.classes_.dtype == torch.uint64
    assert [int(c) for c in clf.classes_.numpy()] == [0, 2**63 + 5, 2**64 - 1]
    ref = DirichletGPClassifier(FourierFeatureKernel(128, seed=0).double(), seed=0).fit(x, y)
    predicted = clf.predict(x, method="mean_field").numpy()
    assert np.array_equal(predicted, ids[ref.predict(x, method="mean_field").numpy()])
    # With num_classes the labels are indices: an id above 2**63 is refused, never wrapped.
    with pytest.raises(ValueError, match=r"labels must hold integer class indices below 2\*\*63"):
        DirichletGPClassifier(FourierFeatureKernel(16, seed=0).double(), num_classes=3).fit(
            x, ids[y.numpy()])


def test_encode_labels():
    idx, classes = encode_labels(torch.tensor([10**6, 0, 10**6, -3]))
    assert classes.tolist() == [-3, 0, 10**6] and idx.tolist() == [2, 1, 2, 0]
    idx, classes = encode_labels(np.array([0, 2, 2]), num_classes=4)
    assert classes.tolist() == [0, 1, 2, 3] and idx.tolist() == [0, 2, 2]
    with pytest.raises(TypeError, match="encode"):
        encode_labels(np.array([1, "a"], dtype=object))
    with pytest.raises(TypeError, match="encode"):
        encode_labels(["a", "b"])
    with pytest.raises(ValueError, match="two distinct classes"):
        encode_labels(torch.tensor([4, 4]))


# ------------------------------------------------------------------------------ kernels refused
@pytest.mark.parametrize("num_classes", [2, 3])
def test_vector_field_kernels_are_refused(num_classes):
    x, y = blobs(6, THREE_CENTRES[:num_classes], 0.4, seed=31)
    for kernel in (CurlFreeFeatureKernel(64, seed=0).double(), CurlFreeKernel().double()):
        clf = DirichletGPClassifier(kernel)
        with pytest.raises(ValueError, match="one output per input.*vector-field"):
            clf.fit(x, y)


def test_exact_path_refuses_random_feature_solver_options():
    x, y = blobs(6, THREE_CENTRES, 0.4, seed=32)
    with pytest.raises(ValueError, match="random-feature kernels only"):
        DirichletGPClassifier(_rbf(1.0), solve="weight").fit(x, y)


# ------------------------------------------------------------------------------ empty and log
@pytest.mark.parametrize("kernel", ["exact", "rff"])
def test_zero_rows_give_empty_results(kernel):
    x, y = blobs(8, THREE_CENTRES, 0.5, seed=33)
    k = _rbf(1.0) if kernel == "exact" else FourierFeatureKernel(64, seed=0).double()
    clf = DirichletGPClassifier(k, seed=0).fit(x, y)
    for method in ("mc", "mean_field", "lognormal"):
        assert clf.predict_proba(x[:0], method=method).shape == (0, 3)
        assert clf.predict_log_proba(x[:0], method=method).shape == (0, 3)
        assert clf.predict(x[:0], method=method).shape == (0,)
    assert clf.latent_posterior(x[:0]).mean.shape == (0, 3)
    with pytest.raises(ValueError, match="x must have 2 columns"):
        clf.predict_proba(torch.zeros(3, 5, dtype=DTYPE))


@pytest.mark.parametrize("method", ["mc", "mean_field", "lognormal"])
def test_predict_log_proba_is_the_log_space_path(method):
    from rfgp.classification import softmax_expectation

    x, y = blobs(10, THREE_CENTRES, 0.5, seed=34)
    clf = DirichletGPClassifier(_rbf(1.0), alpha_epsilon=1e-5, seed=2).fit(x, y)
    post = clf.latent_posterior(x)
    logp = clf.predict_log_proba(x, method=method)
    expected = softmax_expectation(post.mean, post.variance, method, clf.num_samples,
                                   torch.Generator().manual_seed(2), log=True)
    torch.testing.assert_close(logp, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.logsumexp(logp, -1), torch.zeros(30, dtype=DTYPE))
    torch.testing.assert_close(logp.exp(), clf.predict_proba(x, method=method))


# ------------------------------------------------------------------------------ never stale
@pytest.mark.parametrize("kernel", ["exact", "rff"])
def test_changed_kernel_noise_or_settings_never_reuse_the_old_fit(kernel):
    x, y = blobs(10, THREE_CENTRES, 0.5, seed=35)

    def fitted():
        k = _rbf(1.0) if kernel == "exact" else FourierFeatureKernel(64, seed=0).double()
        return DirichletGPClassifier(k, seed=0).fit(x, y)

    clf = fitted()
    before = clf.predict_proba(x, method="mean_field")
    base = clf.kernel
    base.lengthscale = 2.0
    with pytest.raises(RuntimeError, match="changed since fit"):
        clf.predict_proba(x)
    with pytest.raises(RuntimeError, match="changed since fit"):
        clf.log_marginal_likelihood()
    after = clf.fit(x, y).predict_proba(x, method="mean_field")
    assert not torch.allclose(before, after)
    if kernel == "rff":
        base.resample(torch.Generator().manual_seed(5))  # new random weights (a buffer)
        with pytest.raises(RuntimeError, match="changed since fit"):
            clf.predict_proba(x)
        clf.fit(x, y)
    clf.likelihood.noise = clf.likelihood.noise * 2
    with pytest.raises(RuntimeError, match=r"likelihood.noise \(values\) changed since fit"):
        clf.latent_posterior(x)
    clf = fitted()
    clf.alpha_epsilon = 0.5
    with pytest.raises(RuntimeError, match="settings changed since fit"):
        clf.predict(x)


def test_exact_model_refactorises_after_a_change():
    x, y = blobs(10, THREE_CENTRES, 0.5, seed=36)
    lik = DirichletLikelihood(3, alpha_epsilon=0.05, labels=y)
    model = DirichletExactGP(x, lik, _rbf(0.8))
    first = model.latent_moments(x[:4])
    model.covar_module.lengthscale = 1.5
    moved = model.latent_moments(x[:4])
    fresh = DirichletExactGP(x, lik, _rbf(1.5)).latent_moments(x[:4])
    torch.testing.assert_close(moved, fresh, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(first[0], moved[0])


def test_one_exact_path_agrees_with_gpytorch_eval_mode():
    # The classifier's exact posterior is DirichletExactGP's, and GPyTorch's own prediction
    # with that model (eval mode, dense Cholesky) gives the same moments.
    x, y = blobs(12, THREE_CENTRES, 0.5, seed=37)
    xt, _ = blobs(4, THREE_CENTRES, 0.5, seed=38)
    clf = DirichletGPClassifier(_rbf(0.9), alpha_epsilon=0.05).fit(x, y)
    assert isinstance(clf.gp, DirichletExactGP)
    clf.gp.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False), \
            gpytorch.settings.max_cholesky_size(10**6):
        post = clf.gp(xt)
    latent = clf.latent_posterior(xt)
    torch.testing.assert_close(latent.mean, post.mean.T + clf.likelihood.class_offsets,
                               rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(latent.variance, post.variance.T, rtol=1e-6, atol=1e-8)


def test_unsigned_class_ids_survive_pickle():
    import pickle

    x, y = blobs(8, THREE_CENTRES[:2], 0.3, seed=32)
    ids = np.array([3, 2**64 - 1], dtype=np.uint64)
    clf = DirichletGPClassifier(FourierFeatureKernel(32, seed=0).double(), seed=0)
    clf.fit(x, ids[y.numpy()])
    copy = pickle.loads(pickle.dumps(clf))
    assert copy.classes_.dtype == torch.uint64
    assert [int(c) for c in copy.classes_.numpy()] == [3, 2**64 - 1]
    assert torch.equal(copy.predict(x, method="mean_field"), clf.predict(x, method="mean_field"))
