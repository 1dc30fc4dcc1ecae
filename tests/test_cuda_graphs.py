"""CUDA-graph inference (``cuda_graph=True``) on the CPU: the switch and the argument (every
family), when a forward must stay eager, the key that a weight change or another input moves, copies of a
module. The captures and replays themselves are GPU tests (tests/models/test_gpu.py)."""
import copy
import pickle

import pytest
import torch

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.models.skeleton.base import MambaBackbone
from amvim_mm.models.skeleton.graphs import (InferenceGraphs, _no_cast_cache, graphs_requested,
                                             reducer_misfit)
from amvim_mm.registry import MODELS


def build(**kw):
    return MODELS.build(dict(type='Vim', arch='test', img_size=32, out_type='featmap', **kw))


def test_switch_and_argument(monkeypatch):
    monkeypatch.delenv('AMVIM_CUDA_GRAPH', raising=False)
    assert runtime.settings().cuda_graph is True      # on by default (CUDA inference only)
    assert graphs_requested(None) is True and graphs_requested(False) is False
    with runtime.override(cuda_graph=False):
        assert graphs_requested(None) is False and graphs_requested(True) is True
    monkeypatch.setenv('AMVIM_CUDA_GRAPH', '0')
    assert runtime.settings().cuda_graph is False and graphs_requested(None) is False
    monkeypatch.setenv('AMVIM_CUDA_GRAPH', '1')
    assert runtime.settings().cuda_graph is True and graphs_requested(None) is True
    monkeypatch.setenv('AMVIM_CUDA_GRAPH', 'maybe')
    with pytest.raises(ConfigError, match="AMVIM_CUDA_GRAPH='maybe'"):
        runtime.settings()
    monkeypatch.delenv('AMVIM_CUDA_GRAPH')
    with pytest.raises(ConfigError, match='cuda_graph must be True, False or None'):
        build(cuda_graph='yes')


def test_cpu_forward_stays_eager_and_equals_the_plain_one():
    torch.manual_seed(0)
    plain = build().eval()
    graphed = build(cuda_graph=True).eval()
    graphed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for p, q in zip(plain(x), graphed(x), strict=True):
            assert torch.equal(p, q)
    assert graphed._graphs.stats == {'eager': 1} and not graphed._graphs.graphs
    assert InferenceGraphs.why_eager(graphed, x) == 'not a CUDA tensor'


def test_traces_and_compiles_stay_eager(monkeypatch):
    """A jit trace or a torch.compile recording must see the work, never a replay."""
    m = build(cuda_graph=True).eval()
    x = torch.randn(1, 3, 32, 32)
    monkeypatch.setattr(torch.jit, 'is_tracing', lambda: True)
    assert InferenceGraphs.why_eager(m, x) == 'a trace or compile is recording'
    monkeypatch.setattr(torch.jit, 'is_tracing', lambda: False)
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
    assert InferenceGraphs.why_eager(m, x) == 'a trace or compile is recording'
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: False)
    assert InferenceGraphs.why_eager(m, x) == 'not a CUDA tensor'
    with torch.no_grad():
        traced = torch.jit.trace(m, x, check_trace=False)
    for p, q in zip(traced(x), m(x), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_key_follows_weights_shape_autocast_reducer_and_outputs():
    m = build().eval()
    x = torch.randn(1, 3, 32, 32)
    k = InferenceGraphs.key(m, x)
    assert InferenceGraphs.key(m, x) == k
    assert InferenceGraphs.key(m, torch.randn(2, 3, 32, 32)) != k
    with torch.no_grad():
        m.layers[0].mixer.out_proj.weight.mul_(1.0)        # in place: a new version
    k2 = InferenceGraphs.key(m, x)
    assert k2 != k and k2[:-1] == k[:-1]                  # only the weights' part moved
    m.set_token_reduction(dict(type='ToMe', ratio=0.2))
    k3 = InferenceGraphs.key(m, x)
    assert k3 != k2
    m.token_reducer.schedule = m.token_reducer.schedule   # same reducer, same key
    assert InferenceGraphs.key(m, x) == k3
    with runtime.override(fused_mixer=False):
        assert InferenceGraphs.key(m, x) != k3
    # the outputs' form (last_featmap switches it for one call): another graph
    m.out_type = 'raw'
    assert InferenceGraphs.key(m, x) != k3
    m.out_type, m.out_indices = 'featmap', [0]
    assert InferenceGraphs.key(m, x) != k3


def test_copies_start_without_graphs():
    m = build(cuda_graph=True)
    m._graphs.seen[('k', )] = True
    for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert c._graphs is not m._graphs and not c._graphs.seen
        assert c._graphs.max_graphs == m._graphs.max_graphs and c.cuda_graph is True
    m.reset_cuda_graphs()
    assert not m._graphs.seen and not m._graphs.graphs
    with pytest.raises(ValueError, match='max_graphs'):
        InferenceGraphs(0)


#: every backbone on the skeleton (skeleton/base.py) takes cuda_graph
FAMILIES = sorted(n for n, c in MODELS.module_dict.items()
                  if isinstance(c, type) and issubclass(c, MambaBackbone))


@pytest.mark.parametrize('typ', FAMILIES)
def test_every_family_takes_cuda_graph_and_stays_eager_on_the_cpu(typ):
    """VMamba and PlainMamba as the Vim family: the argument is checked, a CPU forward runs
    eagerly and equals the plain model's (the captures and replays: tests/models/test_gpu.py);
    a family's own ``graph_misfit`` reason keeps it eager."""
    with pytest.raises(ConfigError, match='cuda_graph must be True, False or None'):
        MODELS.build(dict(type=typ, arch='test', img_size=64, cuda_graph='yes'))
    torch.manual_seed(0)
    red = dict(type='ToMe', ratio=0.27)
    plain = MODELS.build(dict(type=typ, arch='test', img_size=64, token_reduction=red)).eval()
    graphed = MODELS.build(dict(type=typ, arch='test', img_size=64, token_reduction=red,
                                cuda_graph=True)).eval()
    graphed.load_state_dict(plain.state_dict())
    assert graphed.graph_misfit() is None
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for p, q in zip(plain(x), graphed(x), strict=True):
            assert torch.equal(p, q)
    assert graphed._graphs.stats == {'eager': 1} and not graphed._graphs.graphs
    assert graphed.token_counts == plain.token_counts
    assert InferenceGraphs.why_eager(graphed, x) == 'not a CUDA tensor'
    graphed.graph_misfit = lambda: f'{typ} cannot be captured'
    assert InferenceGraphs.why_eager(graphed, x) == f'{typ} cannot be captured'


def test_reducer_allow_list():
    """Reducers that decide once per batch on the GPU with scheduled counts are captured
    (DynamicViT included: its inference keeps a scheduled count); a CPU-drawn or data-dependent
    count stays eager."""
    m = build().eval()
    for cfg in (dict(type='ToMe', ratio=0.2), dict(type='EViT', keep_rate=0.7, locations=(1, )),
                dict(type='ToP', keep_rate=0.7, locations=(1, )),
                dict(type='DynamicViT', keep_rate=0.8, locations=(0, ))):
        m.set_token_reduction(cfg)
        assert reducer_misfit(m.token_reducer) is None, cfg
    assert reducer_misfit(None) is None
    for cfg in (dict(type='RandomPrune', ratio=0.2), dict(type='LTMP')):
        m.set_token_reduction(cfg)
        assert 'not on the graph allow-list' in reducer_misfit(m.token_reducer), cfg


def test_capture_turns_autocast_cast_cache_off_and_keeps_the_rest():
    """Captures run with autocast's weight-cast cache off (a graph must hold its own casts, see
    graphs._no_cast_cache), the caller's autocast state otherwise unchanged and restored."""
    assert torch.is_autocast_cache_enabled()
    with _no_cast_cache():
        assert not torch.is_autocast_cache_enabled()
        assert not torch.is_autocast_enabled('cuda')
    assert torch.is_autocast_cache_enabled()
