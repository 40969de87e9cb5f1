"""The plug-in targets at their end points and in low precision (router/targets.py)."""

import pytest


def test_lossy_is_exact_at_the_drafter_end_and_finite_in_float16():
    import torch

    from router.loop.options import DecodeOptions
    from router.rules import get_rule

    q = torch.tensor([[0.5, 0.3, 0.2]])
    p = torch.tensor([[0.0, 0.0, 1.0]])  # the verifier gives the drafter's favourites probability 0
    assert torch.equal(get_rule("lossy").target(q, p, 1.0), q)
    half = get_rule("lossy").target(q.half(), p.half(), 0.5)
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    assert torch.allclose(half.float(), get_rule("lossy").target(q, p, 0.5), atol=1e-3)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        DecodeOptions(temperature=float("nan"))
