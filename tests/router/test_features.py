"""Router features from the logits equal those from the probabilities alone (the loop's cheaper path)."""

import pytest
import torch

from router.features import FEATURE_NAMES, lookahead_features, position_stats


def _logits(seed: int, shape: tuple, scale: float = 4.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("shape", [(2, 5, 151936), (3, 1000), (7,)])
def test_features_from_logits_equal_features_from_probabilities(shape):
    zq, zp = _logits(0, shape), _logits(1, shape) + 3.0  # shifted logits: lse is not 0
    zq[..., :3] = -float("inf")  # tokens one model rules out: log q clamps at log EPS either way
    zp[..., :3] = 60.0  # a very peaked p: q at p's argmax far below EPS matters for KL
    q, p = zq.softmax(-1), zp.softmax(-1)
    plain, q_arg, p_arg = position_stats(q, p)
    fast, q_arg2, p_arg2 = position_stats(q, p, zq, zp)
    assert torch.equal(q_arg, q_arg2) and torch.equal(p_arg, p_arg2)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=2e-5)
    kl = FEATURE_NAMES.index("kl_pq")
    assert bool((plain[..., kl] > 1).all())  # the clamped tail really entered the comparison
    torch.testing.assert_close(lookahead_features(p, zp), lookahead_features(p), rtol=1e-5, atol=2e-5)


def test_features_reject_logits_of_another_shape():
    q = _logits(0, (2, 10)).softmax(-1)
    with pytest.raises(ValueError, match="q_logits has shape"):
        position_stats(q, q, _logits(1, (2, 11)), None)
