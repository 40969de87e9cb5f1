"""Blocked reductions over the vocabulary give exactly what torch's own reductions give."""

import pytest
import torch

from router.reduce import fast_argmax, fast_max, fast_topk_ids, top2


def _cases():
    gen = torch.Generator().manual_seed(0)
    for shape in ((3, 4, 151936), (2, 1024), (5, 1000), (7,), (2, 3, 97)):  # blocked widths and the fallbacks
        x = torch.randn(*shape, generator=gen)
        yield x
        yield torch.softmax(x * 4, -1)
    ties = torch.zeros(2, 1024)
    ties[0, [5, 700]] = 3.0  # the max twice: first index, and the second largest equals the max
    ties[1, [900, 130]] = 2.0
    yield ties
    yield torch.zeros(4, 256)  # all equal


@pytest.mark.parametrize("x", list(_cases()))
def test_blocked_reductions_equal_torch(x):
    values, index = x.max(-1)
    top, arg, second = top2(x)
    assert torch.equal(top, values) and torch.equal(arg, index) and torch.equal(fast_argmax(x), x.argmax(-1))
    assert torch.equal(fast_max(x)[0], values) and torch.equal(fast_max(x)[1], index)
    assert torch.equal(second, x.scatter(-1, index[..., None], -float("inf")).amax(-1))
    k = min(8, x.shape[-1])
    ids = fast_topk_ids(x, k)
    assert torch.equal(x.gather(-1, ids), x.topk(k, -1).values)  # same values, largest first


def test_ties_take_the_first_index():
    x = torch.zeros(1, 1024)
    x[0, [700, 5]] = 1.0
    top, arg, second = top2(x)
    assert arg.item() == 5 and second.item() == 1.0 and fast_argmax(x).item() == 5
