"""Decision margins of the reducers that choose by the features
(:mod:`amvim_mm.models.reduction.margins`): the definitions against brute force, and the
recording around a real forward."""
import itertools

import torch

import amvim_mm  # noqa: F401
from amvim_mm import runtime
from amvim_mm.models.reduction import margins
from amvim_mm.registry import MODELS


def _brute_matching(scores, k):
    """The smallest gap of ToMe's choices, from every pair of candidates."""
    out = []
    for s in scores:
        best = s.max(1).values
        order = sorted(range(len(best)), key=lambda i: -best[i].item())
        gaps = []
        if k < len(best):
            gaps.append(best[order[k - 1]] - best[order[k]])
        for a in order[:k]:
            row = sorted(s[a].tolist(), reverse=True)
            if len(row) > 1:
                gaps.append(row[0] - row[1])
        out.append(min(gaps) if gaps else 1.0)        # no choice: no tie
    return torch.tensor(out)


def test_matching_margin_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    for A, Bn, k in itertools.product((3, 8), (1, 2, 7), (1, 2, 3)):
        scores = torch.rand(4, A, Bn, generator=g)
        assert torch.allclose(margins.matching_margin(scores, k),
                              _brute_matching(scores, k).float())


def test_ranking_margin_is_the_relative_gap_at_the_cut():
    score = torch.tensor([[5.0, 1.0, 3.0, 2.0], [0.0, 4.0, 4.0, 1.0]])
    # two lowest removed: the gap between the 2nd and 3rd lowest over the largest
    assert torch.allclose(margins.ranking_margin(score, 2), torch.tensor([1 / 5, 3 / 4]))
    assert torch.allclose(margins.ranking_margin(score, 3), torch.tensor([2 / 5, 0.0]))


def test_a_forward_records_the_smallest_margin_per_image():
    """A forward records one margin per image, the smallest over its steps: an image of one
    colour with no position embedding (every token alike) is at a tie, noise is not."""
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64, out_type='cls_token',
                          token_reduction=dict(type='ToMe', r=3))).eval()
    with torch.no_grad():
        m.pos_embed.zero_()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x[1] = 0.5
    with torch.no_grad(), margins.recording() as rec, \
            runtime.override(cpu_kernels=False, reduction_kernels=False):
        m(x)
    assert rec.margin.shape == (2, )
    assert rec.near_ties(2).tolist() == [False, True]
    with torch.no_grad():
        m(x)                                          # outside a recording: nothing noted
    assert margins.active() is None
