"""GPU checks of whole models (skipped with the reason on machines without CUDA).

Run on the GPU machine by ``tools/gpu/run.sh``; the log is committed under ``benchmarks/``.
"""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.ops.backends import mamba_selective_scan
from amvim_mm.registry import MODELS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available'),
]
needs_kernel = pytest.mark.skipif(mamba_selective_scan()[0] is None,
                                  reason='mamba-ssm CUDA kernel is not importable')


@pytest.fixture(autouse=True)
def _exact(exact_fp32):
    """Every test here without TF32 (tests/conftest.py)."""
    yield


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def assert_same_outputs(cpu, gpu, x, tol):
    """The CPU and the GPU model see the same token counts and give the same outputs."""
    with torch.no_grad():
        a = cpu(x)
        b = gpu(x.cuda())
    assert cpu.token_counts == gpu.token_counts
    for p, q in zip(a, b, strict=True):
        assert q.shape == p.shape and rel(q.cpu(), p) < tol


def same_weights(typ, arch, **kw):
    """The same model on the CPU and on the GPU (eval mode)."""
    torch.manual_seed(0)
    cpu = MODELS.build(dict(type=typ, arch=arch, **kw)).eval()
    gpu = MODELS.build(dict(type=typ, arch=arch, **kw)).eval().cuda()
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


def pair(typ, **kw):
    torch.manual_seed(0)
    cpu = MODELS.build(dict(type=typ, arch='tiny', img_size=224, **kw)).eval()
    # the unfused mixer: these tests check the mamba-ssm kernels (the fused Triton path has
    # its own tests in test_fused_mixer.py)
    gpu = MODELS.build(dict(type=typ, arch='tiny', img_size=224, fused_mixer=False,
                            **kw)).eval().cuda()
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu


@needs_kernel
@pytest.mark.parametrize('typ', ['Vim', 'AMVim', 'LocalVim'])
@pytest.mark.parametrize('out_type', ['cls_token', 'featmap'])
def test_gpu_cuda_kernel_matches_cpu(typ, out_type):
    kw = dict(out_type=out_type, out_indices=(-1, ) if out_type == 'cls_token' else (3, 11, 19))
    cpu, gpu = pair(typ, **kw)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        a = cpu(x)
        b = gpu(x.cuda())
    for p, q in zip(a, b, strict=True):
        assert rel(q.cpu(), p) < 1e-4


@needs_kernel
def test_gpu_bf16_autocast_close_to_fp32():
    _, gpu = pair('AMVim')
    x = torch.randn(4, 3, 224, 224, device='cuda')
    with torch.no_grad():
        ref = gpu(x)[0]
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out = gpu(x)[0]
    assert torch.isfinite(out).all() and rel(out, ref) < 5e-2


@needs_kernel
@pytest.mark.parametrize('red', [dict(type='ToMe', ratio=0.36),
                                 dict(type='RandomPrune', ratio=0.36),
                                 dict(type='ToP', keep_rate=0.7, locations=(5, 11)),
                                 dict(type='EViT', keep_rate=0.7, locations=(5, 11))])
def test_gpu_reducers_match_cpu(red):
    cpu, gpu = pair('AMVim', out_type='featmap', out_indices=(5, 23), token_reduction=red)
    x = torch.randn(2, 3, 224, 224)
    assert_same_outputs(cpu, gpu, x, 1e-3)


@pytest.mark.parametrize('typ', ['Vim', 'AMVim'])
@pytest.mark.parametrize('red', [dict(type='ToP', keep_rate=0.7, locations=(5, 11)),
                                 dict(type='ToP', keep_rate=0.7, locations=(5, 11),
                                      gap_delta='token'),
                                 dict(type='EViT', keep_rate=0.7, locations=(5, 11))],
                         ids=['top-bias', 'top-token', 'evit'])
def test_gpu_top_on_the_fused_mixer_equals_the_pytorch_mixer(typ, red):
    """ToP's importance and aligned scans inside the fused Triton mixer (the plan keeps the
    Triton route for those blocks) against the PyTorch mixer (fp32, no TF32): same kept
    tokens, same outputs."""
    torch.manual_seed(0)
    cfg = dict(type=typ, arch='tiny', img_size=224, out_type='featmap', out_indices=(5, 23),
               token_reduction=red)
    fused = MODELS.build(dict(cfg, fused_mixer=True)).eval().cuda()
    ref = MODELS.build(dict(cfg, fused_mixer=False, scan_backend='torch')).eval().cuda()
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(4, 3, 224, 224, device='cuda')
    with torch.no_grad():
        plan = fused.execution_plan(x)
        assert {b.mixer.route for b in plan.blocks} == {'triton'}, plan.describe()
        assert {b.mixer.route for b in ref.execution_plan(x).blocks} == {'torch'}
        a, b = fused(x), ref(x)
    assert fused.token_counts == ref.token_counts
    assert torch.equal(fused.last_context.source, ref.last_context.source)   # same survivors
    for p, q in zip(a, b, strict=True):
        assert p.shape == q.shape and rel(p, q) < 1e-4, rel(p, q)


@needs_kernel
def test_gpu_training_step_with_tome():
    _, gpu = pair('Vim', token_reduction=dict(type='ToMe', r=5))
    gpu.train()
    x = torch.randn(4, 3, 224, 224, device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        loss = gpu(x)[0].float().pow(2).mean()
    loss.backward()
    g = gpu.patch_embed.proj.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


@needs_kernel
def test_gpu_cuda_graph_capture_with_reduction():
    _, gpu = pair('AMVim', token_reduction=dict(type='ToMe', ratio=0.27))
    x = torch.randn(8, 3, 224, 224, device='cuda')
    from amvim_mm.bench.measure import eager_and_replayed
    with torch.no_grad():
        ref, out = eager_and_replayed(lambda: gpu(x)[0])
    # ToMe merges with scatter_add, whose float summation order on CUDA is not fixed
    assert rel(out, ref) < 1e-5


@needs_kernel
def test_gpu_dynamicvit_inference_matches_cpu_and_trains_masked():
    red = dict(type='DynamicViT', keep_rate=0.7, locations=(5, 11, 17))
    cpu, gpu = pair('AMVim', out_type='featmap', out_indices=(5, 23), token_reduction=red)
    x = torch.randn(2, 3, 224, 224)
    assert_same_outputs(cpu, gpu, x, 1e-3)
    assert gpu.token_counts[-1] == int(196 * 0.343) + 1     # and the class token
    # the masked training forward in bf16, with its gradient into the predictors
    gpu.train()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        out = gpu(x.cuda())[-1]
        loss = out.float().pow(2).mean() + gpu.token_reducer.loss_terms()['loss_keep_ratio']
    loss.backward()
    g = gpu.token_reducer.predictors[0].in_conv[1].weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    # and the fused inference path in a CUDA graph
    gpu.eval()
    from amvim_mm.bench.measure import eager_and_replayed
    fused = MODELS.build(dict(type='Vim', arch='small', token_reduction=red)).eval().cuda()
    xb = torch.randn(8, 3, 224, 224, device='cuda')
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        ref, out = eager_and_replayed(lambda: fused(xb)[0])
    assert rel(out, ref) < 1e-5 and fused.token_counts[-1] == 67 + 1


# ------------------------------------------------------------------------------ VMamba
def vmamba_pair(**kw):
    return same_weights('VMamba', 'tiny', **kw)


@needs_kernel
@pytest.mark.parametrize('red', [None, dict(type='ToMe', ratio=0.4),
                                 dict(type='ToP', keep_rate=0.6, locations=(2, 6)),
                                 dict(type='EViT', keep_rate=0.6, locations=(2, 6))],
                         ids=['none', 'tome', 'top', 'evit'])
def test_gpu_vmamba_kernel_matches_cpu(red):
    """The mamba-ssm kernel with grouped B/C (four directions), and with ToP's gap folding,
    equals the CPU's PyTorch scan; dense maps at a non-square input."""
    cpu, gpu = vmamba_pair(token_reduction=red)
    x = torch.randn(2, 3, 224, 192)
    assert_same_outputs(cpu, gpu, x, 1e-4)


@needs_kernel
def test_gpu_vmamba_bf16_training_step_and_graph():
    """bf16 close to fp32 (no reduction: a reducer's choices legitimately change with the
    precision); with ToMe in stage 3: finite bf16 outputs, a training step with gradients
    everywhere, and a CUDA-graph replay equal to the eager forward."""
    _, plain = vmamba_pair()
    x = torch.randn(4, 3, 224, 224, device='cuda')
    with torch.no_grad():
        ref = plain(x)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out = plain(x)
    for p, q in zip(ref, out, strict=True):
        assert torch.isfinite(q).all() and rel(q, p) < 5e-2
    _, gpu = vmamba_pair(token_reduction=dict(type='ToMe', ratio=0.4))
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        assert all(torch.isfinite(o).all() for o in gpu(x))
    gpu.train()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        loss = sum(o.float().square().mean() for o in gpu(x))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in gpu.parameters())
    gpu.eval()
    from amvim_mm.bench.measure import eager_and_replayed
    with torch.no_grad():
        a, b = eager_and_replayed(lambda: gpu(x)[2])
    assert rel(b, a) < 1e-5      # the merge's scatter-add is atomic: not bit-reproducible


# ------------------------------------------------------------------------------ PlainMamba
def plainmamba_pair(**kw):
    return same_weights('PlainMamba', 'l1', **kw)


@needs_kernel
@pytest.mark.parametrize('red', [None, dict(type='ToMe', ratio=0.4),
                                 dict(type='ToP', keep_rate=0.6, locations=(5, 11, 17)),
                                 dict(type='ToP', keep_rate=0.6, locations=(5, 11, 17),
                                      align=False),
                                 dict(type='EViT', keep_rate=0.6, locations=(5, 11, 17))],
                         ids=['none', 'tome', 'top', 'top-noalign', 'evit'])
def test_gpu_plainmamba_matches_cpu(red):
    """The mamba-ssm kernel with grouped B/C + direction biases, the Triton cross-scan over
    per-sample snake orders, and ToP's aligned gathers equal the CPU's PyTorch path; dense
    maps at a non-square input."""
    cpu, gpu = plainmamba_pair(token_reduction=red, out_indices=(5, 23))
    x = torch.randn(2, 3, 224, 192)
    assert_same_outputs(cpu, gpu, x, 1e-4)


@needs_kernel
def test_gpu_plainmamba_reduced_graph_and_training():
    """L1 with the budget schedule: CUDA-graph replay equal to the eager forward; a bf16
    training step with ToP gives finite gradients."""
    _, gpu = plainmamba_pair(token_reduction=dict(type='ToP', keep_rate=0.6,
                                                  locations=(5, 11, 17)),
                             out_type='avg_featmap')
    x = torch.randn(4, 3, 224, 224, device='cuda')
    from amvim_mm.bench.measure import eager_and_replayed
    with torch.no_grad():
        a, b = eager_and_replayed(lambda: gpu(x)[0])
    assert rel(b, a) < 1e-5
    gpu.train()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        loss = gpu(x)[0].float().square().mean()
    loss.backward()
    grads = [p.grad for p in gpu.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------------------------ CUDA graphs
#: the backbones of the graph checks: Vim-T dense (four maps, no class token), VMamba-T (a map
#: per stage) and PlainMamba-L1 (two maps)
GRAPH_CFGS = dict(
    Vim=dict(arch='tiny', img_size=224, out_type='featmap', out_indices=(5, 11, 17, 23),
             with_cls_token=False, final_norm=False),
    VMamba=dict(arch='tiny'),
    PlainMamba=dict(arch='l1', out_indices=(5, 23)),
)


def graph_pair(typ='Vim', **kw):
    """The same backbone of ``GRAPH_CFGS`` with and without ``cuda_graph`` (eval, CUDA)."""
    cfg = dict(type=typ, **GRAPH_CFGS[typ], **kw)
    torch.manual_seed(0)
    eager = MODELS.build(cfg).eval().cuda()
    graphed = MODELS.build(dict(cfg, cuda_graph=True)).eval().cuda()
    graphed.load_state_dict(eager.state_dict())
    return eager, graphed


def assert_replays_equal_the_eager_forward(eager, graphed, tol, bf16=True):
    """Four calls on new images (bf16 autocast, or fp32): the first eager, the second captured
    and replayed, the later ones replayed; every output equals the eager model's within ``tol``
    and keeps its shape and dtype, clones that a later replay does not overwrite; the token
    counts restored after each call."""
    g = graphed._graphs
    outs = []
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16, enabled=bf16):
        for i in range(4):
            x = torch.randn(2, 3, 256, 224, device='cuda')
            ref, out = eager(x), graphed(x)
            outs.append((ref, out))
            assert graphed.token_counts == eager.token_counts
    assert (g.stats['eager'], g.stats['capture'], g.stats['replay']) == (1, 1, 3)
    for ref, out in outs:                      # earlier outputs untouched by later replays
        for p, q in zip(ref, out, strict=True):
            assert q.shape == p.shape and q.dtype == p.dtype
            assert rel(q, p) < tol, rel(q, p)


@pytest.mark.parametrize('red', [None, dict(type='ToMe', ratio=0.3),
                                 dict(type='ToP', keep_rate=0.7, locations=(5, 11)),
                                 dict(type='DynamicViT', keep_rate=0.8, locations=(5, 11))],
                         ids=['none', 'tome', 'top', 'dynamicvit'])
def test_gpu_cuda_graph_backbone_replays_equal_the_eager_forward(red):
    """cuda_graph=True: the first call of a shape eager, the second captured and replayed,
    later ones replayed; every output equals the eager model's on new images (bf16, fused
    path), clones that a later replay does not overwrite; the token counts restored."""
    eager, graphed = graph_pair(token_reduction=red)
    assert_replays_equal_the_eager_forward(eager, graphed, 1e-5 if red else 1e-6)


@pytest.mark.parametrize('red', [None, dict(type='ToMe', ratio=0.4)], ids=['none', 'tome'])
@pytest.mark.parametrize('typ', ['VMamba', 'PlainMamba'])
def test_gpu_cuda_graph_vmamba_plainmamba_replay_equal_the_eager_forward(typ, red):
    """VMamba and PlainMamba take cuda_graph=True as the Vim family (skeleton/base.py):
    eager, captured, replayed; the outputs (every stage's or layer's map, non-square input)
    and the token counts equal the eager model's, with and without ToMe. The ToMe case runs in
    fp32: its merge (PyTorch's scatter-add, atomic on CUDA) sums in a different order each call,
    and under bf16 autocast the next cast to bf16 turns that last-bit difference into a bf16
    rounding step (seen: 2.5e-3 relative for VMamba, eager against replay, H200)."""
    eager, graphed = graph_pair(typ, token_reduction=red)
    assert_replays_equal_the_eager_forward(eager, graphed, 1e-5 if red else 1e-6,
                                           bf16=red is None)
    if red is not None:            # ToMe merged: the replayed counts are below the dense ones
        counts = graphed.token_counts
        eager.set_token_reduction(None)
        with torch.no_grad():
            eager(torch.randn(2, 3, 256, 224, device='cuda'))
        assert sum(counts) < sum(eager.token_counts)


def test_gpu_cuda_graph_recaptures_after_a_weight_change_and_keeps_checks():
    """A weight changed in place (load, optimizer step) is a new key: captured again after an
    eager call; the old graph is dropped. NaN images still fail before a replay; training,
    gradients, hooks and a reducer off the allow-list run eagerly."""
    from amvim_mm.errors import ConfigError
    from amvim_mm.models.skeleton.graphs import InferenceGraphs
    eager, graphed = graph_pair()
    g = graphed._graphs
    x = torch.randn(1, 3, 224, 224, device='cuda')
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        graphed(x), graphed(x)
        assert g.stats['capture'] == 1 and len(g.graphs) == 1
        for m in (eager, graphed):
            m.layers[3].mixer.out_proj.weight.mul_(0.5)
        outs = [graphed(x) for _ in range(3)]
        assert g.stats['capture'] == 2 and len(g.graphs) == 1 and g.stats['replay'] == 3
        ref = eager(x)
        for p, q in zip(ref, outs[-1], strict=True):
            assert rel(q, p) < 1e-6
        bad = x.clone()
        bad[0, 0, 0, 0] = float('nan')
        with pytest.raises(ConfigError, match='non-finite'):
            graphed(bad)
    assert InferenceGraphs.why_eager(graphed, x) == 'gradients enabled'
    with torch.no_grad():
        graphed.train()
        assert InferenceGraphs.why_eager(graphed, x) == 'training mode'
        graphed.eval()
        h = graphed.layers[0].register_forward_hook(lambda *a: None)
        assert InferenceGraphs.why_eager(graphed, x).startswith('forward hooks')
        h.remove()
        assert InferenceGraphs.why_eager(graphed, x) is None
        graphed.set_token_reduction(dict(type='RandomPrune', ratio=0.2))
        assert 'RandomPrune is not on the graph allow-list' in \
            InferenceGraphs.why_eager(graphed, x)


@pytest.mark.parametrize('typ', ['ViL', 'PlainMamba', 'Vim'])
def test_gpu_cuda_graph_under_autocast_holds_its_weight_casts(typ):
    """A backbone graph captured inside the caller's bf16 autocast region must cast the weights
    itself: with autocast's cast cache on, the capture read the warm-up's cached bf16 copies,
    freed when the region ended, and later replays read freed memory (an illegal address on
    the H200 for ViL-T). Replays after the region ended and the memory was overwritten equal
    the eager forward."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type=typ, arch='test', img_size=64, out_type='featmap',
                          cuda_graph=True)).eval().cuda()
    x = torch.randn(2, 3, 64, 64, device='cuda')
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        for _ in range(3):                  # eager, capture, replay in one autocast region
            m(x)
    assert m._graphs.stats['capture'] == 1
    junk = [torch.full((1 << 20, ), float('nan'), device='cuda') for _ in range(64)]
    torch.cuda.empty_cache()
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        replayed = m(x)
        m.cuda_graph = False
        eager = m(x)
    del junk
    assert m._graphs.stats['replay'] >= 2
    for a, b in zip(replayed, eager, strict=True):
        assert torch.isfinite(a).all() and rel(a, b) < 1e-2
