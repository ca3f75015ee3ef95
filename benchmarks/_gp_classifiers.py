"""GPyTorch's GP classifiers as the classification benchmarks run them: the variational GP
(Bernoulli or softmax likelihood, trained until its ELBO stalls) and the exact Dirichlet GP."""

from __future__ import annotations

import math

import torch
from _elbo import train_until_elbo_stalls

#: Training rows of the exact GP at most, and entries of its C batched kernel matrices (8 bytes
#: each: 4 GB): letter's 26 classes get fewer training rows than EXACT_MAX.
EXACT_MAX = 10_000
EXACT_MAX_ENTRIES = 5e8
#: Draws of the latents (or likelihood samples) behind the probabilities.
LIKELIHOOD_SAMPLES = 256


def _rbf_ard(d, batch_shape=None):
    import gpytorch

    batch_shape = torch.Size() if batch_shape is None else batch_shape
    return gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch_shape),
        batch_shape=batch_shape)


def svgp(xtr, ytr, xte, num_classes, num_inducing, seed, quick):
    """GPyTorch's variational GP classifier, trained until its ELBO stops improving."""
    import gpytorch

    g = torch.Generator().manual_seed(seed)
    z = xtr[torch.randperm(xtr.shape[0], generator=g)[:num_inducing]].clone()
    binary = num_classes == 2
    latents = 1 if binary else num_classes
    batch = torch.Size([]) if binary else torch.Size([latents])

    class Model(gpytorch.models.ApproximateGP):
        def __init__(self):
            inducing = z if binary else z.unsqueeze(0).repeat(latents, 1, 1)
            dist = gpytorch.variational.CholeskyVariationalDistribution(
                z.shape[0], batch_shape=batch)
            strategy = gpytorch.variational.VariationalStrategy(
                self, inducing, dist, learn_inducing_locations=True)
            if not binary:
                strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                    strategy, num_tasks=latents)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = _rbf_ard(z.shape[1], batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    model = Model().double()
    if binary:
        likelihood = gpytorch.likelihoods.BernoulliLikelihood()
        targets = ytr.double()
    else:
        likelihood = gpytorch.likelihoods.SoftmaxLikelihood(
            num_features=latents, num_classes=num_classes, mixing_weights=False)
        targets = ytr
    likelihood = likelihood.double()
    max_epochs, patience = (5, 3) if quick else (100, 3)
    epochs, best = train_until_elbo_stalls(model, likelihood, xtr, targets, g,
                                           patience=patience, max_epochs=max_epochs,
                                           progress=not quick)
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(LIKELIHOOD_SAMPLES):
        out = []
        for start in range(0, xte.shape[0], 2048):
            dist = likelihood(model(xte[start:start + 2048]))
            if binary:
                p1 = dist.probs.reshape(-1, dist.probs.shape[-1]).mean(0)
                out.append(torch.stack([1 - p1, p1], -1))
            else:
                probs = dist.probs
                out.append(probs.reshape(-1, *probs.shape[-2:]).mean(0))
    return torch.cat(out).numpy(), {"M": z.shape[0], "epochs": epochs, "elbo": -best}


def exact_dirichlet(xtr, ytr, xte, num_classes, seed, quick, max_rows=EXACT_MAX):
    """GPyTorch's exact Dirichlet GP classifier on at most ``max_rows`` training rows."""
    import gpytorch
    from gpytorch.likelihoods import DirichletClassificationLikelihood

    rows = min(max_rows, int(math.sqrt(EXACT_MAX_ENTRIES / num_classes)))
    if xtr.shape[0] > rows:
        g = torch.Generator().manual_seed(seed)
        keep = torch.randperm(xtr.shape[0], generator=g)[:rows]
        xtr, ytr = xtr[keep], ytr[keep]
    likelihood = DirichletClassificationLikelihood(
        ytr, learn_additional_noise=False, dtype=torch.float64)
    batch = torch.Size([likelihood.num_classes])

    class Model(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(xtr, likelihood.transformed_targets, likelihood)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = _rbf_ard(xtr.shape[1], batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x))

    model = Model().double()
    likelihood = likelihood.double()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    likelihood.train()
    steps = 5 if quick else 50
    for _ in range(steps):
        opt.zero_grad()
        loss = -mll(model(xtr), likelihood.transformed_targets).sum()
        loss.backward()
        opt.step()
    model.eval()
    g = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        for start in range(0, xte.shape[0], 2048):
            latent = model(xte[start:start + 2048])
            mean, std = latent.mean, latent.variance.clamp_min(0).sqrt()  # (C, M)
            eps = torch.randn(LIKELIHOOD_SAMPLES, *mean.shape, generator=g, dtype=mean.dtype)
            probs = torch.softmax(mean + std * eps, dim=1).mean(0)  # (C, M)
            out.append(probs.T)
    return torch.cat(out).numpy(), {"n_train": xtr.shape[0], "steps": steps}
