"""The glossary (docs/guide/glossary.md) agrees with the code: it comes first in the guide, it
defines the terms the code uses, its stage table names the report keys and options that exist,
and its sign convention and formula of the evidence are what the public functions compute."""

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from rfgp import RandomFeatureGP
from rfgp.inference import stochastic_log_evidence
from rfgp.kernels import FourierFeatureKernel
from rfgp.recipes import FitReport, RegressionOptions

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = (ROOT / "docs" / "guide" / "glossary.md").read_text()
TERMS = ["Features", "D", "Outputscale", "Noise", "Weight space and function space",
         "Gram matrix B", "Evidence", "Calibration", "Time budget", "Machine rate", "Solve",
         "Chunk", "Shard"]


def _stage_table():
    """Rows of the glossary's stage table: ``[stage, report key, what, options]``."""
    rows = [line.strip("|").split("|") for line in GLOSSARY.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")]
    return [[cell.strip() for cell in row] for row in rows]


def test_the_glossary_comes_first_in_the_guide():
    nav = (ROOT / "mkdocs.yml").read_text().split("  - User guide:\n", 1)[1]
    assert nav.splitlines()[0].strip().endswith(": guide/glossary.md")


@pytest.mark.parametrize("term", TERMS)
def test_every_term_has_an_entry(term):
    assert f"\n### {term}\n" in GLOSSARY


def test_the_stage_table_names_every_report_key():
    # FitReport documents the keys of its ``seconds``: the table must name each of them.
    documented = re.search(r"seconds: measured seconds per stage \((.*?)\)", FitReport.__doc__,
                           flags=re.S).group(1)
    keys = set(re.findall(r'``"(\w+)"``', documented))
    assert len(keys) >= 6
    assert keys == {row[1].strip("`") for row in _stage_table() if row[1] != "(none)"}


def test_each_stage_is_named_by_its_report_key():
    # A stage's module, function and report key share its name.
    assert all(row[0].split()[0] == row[1].strip("`")
               for row in _stage_table() if row[1] != "(none)")


def test_the_stage_table_names_existing_options():
    options = {field.name for field in dataclasses.fields(RegressionOptions)}
    named = {name for row in _stage_table() for name in re.findall(r"`(\w+)`", row[3])}
    assert named and named <= options


def test_the_evidence_has_one_sign_and_the_glossary_formula():
    # log p(y) = log N(y; 0, Z Z^T + s I): the dense Gaussian density, larger is better; the
    # fitted model and the stochastic estimator (exact, error 0, on a weight-space fit) agree.
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=g, dtype=torch.float64)
    y = torch.stack([torch.sin(5 * x[:, 0]), x[:, 1]], -1)
    y = y + 0.1 * torch.randn(60, 2, generator=g, dtype=torch.float64)
    noise = 0.05
    gp = RandomFeatureGP(FourierFeatureKernel(32, seed=0).double(), noise=noise, solve="weight")
    gp.fit(x, y)
    with torch.no_grad():
        z = gp.kernel.features(x)  # real features: Re k_hat = Z Z^T
        covariance = z @ z.T + noise * torch.eye(60, dtype=torch.float64)
        prior = torch.distributions.MultivariateNormal(torch.zeros(60, dtype=torch.float64),
                                                       covariance)
        dense = sum(prior.log_prob(y[:, t]) for t in range(2))
    reported = gp.log_marginal_likelihood()
    estimate, error = stochastic_log_evidence(gp)
    scale = 1e-10 * float(dense.abs())
    assert abs(float(reported - dense)) < scale and abs(float(estimate - dense)) < scale
    assert error == 0
    # A loss is the negative log evidence per datum: higher evidence, lower loss.
    losses = gp.optimize_hyperparameters(x, y, num_iterations=5)
    assert losses[-1] <= -float(dense) / (60 * 2) + 1e-12
    assert math.isclose(losses[-1], -float(gp.log_marginal_likelihood()) / (60 * 2),
                        rel_tol=1e-6)
