"""Closed-form factors B(omega) with B B^T = |omega|^2 I - omega omega^T."""


import pytest
import torch

from rfgp.kernels._vector_field.factors import div_free_factor, div_free_factor_rank
from tests.helpers import DT, gen


# ----------------------------------------------------------------- factors and feature identities
@pytest.mark.parametrize("dim,factor", [(2, "rotation"), (3, "cross"), (3, "complement"),
                                        (3, "projection"), (5, "complement"), (5, "projection"),
                                        (2, "complement"), (4, "auto")])
def test_div_free_factor_closed_forms(dim, factor):
    omega = torch.randn(50, dim, generator=gen(dim), dtype=DT) * 3
    omega[0] = 0.0  # A(0) = 0: the factor must be zero, not NaN
    omega[1] = 0.0
    omega[1, 0] = -2.0  # u_1 = -1: the Householder sign branch
    b = div_free_factor(omega, factor)
    assert b.shape == (50, dim, div_free_factor_rank(dim, factor))
    assert torch.isfinite(b).all()
    sq = omega.pow(2).sum(-1)[:, None, None]
    target = sq * torch.eye(dim, dtype=DT) - omega.unsqueeze(-1) * omega.unsqueeze(-2)
    torch.testing.assert_close(b @ b.mT, target, atol=1e-12, rtol=0)
    assert (b[0] == 0).all()


def test_div_free_factor_bad_dimension():
    with pytest.raises(ValueError, match="factor='rotation'"):
        div_free_factor(torch.ones(4, 3), "rotation")
    with pytest.raises(ValueError, match="factor='cross'"):
        div_free_factor(torch.ones(4, 2), "cross")
    with pytest.raises(ValueError, match="factor must be one of"):
        div_free_factor(torch.ones(4, 2), "cholesky")
