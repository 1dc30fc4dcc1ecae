"""The execution plan (amvim_mm.models.execution): one frozen decision per forward, what it
says for CPU forwards, ToP's blocks and ToMe's steps, and that the blocks follow it."""
import dataclasses

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm import runtime
from amvim_mm.models import execution
from amvim_mm.models.vim import block as block_mod
from amvim_mm.models.vim import mixer as mixer_mod
from amvim_mm.models.vim import embed as vim_embed
from amvim_mm.models.reduction import session as session_mod
from amvim_mm.ops import cpu_ops
from amvim_mm.registry import MODELS



def _kernels() -> bool:
    return cpu_ops.status()[0]


def _model(**kw):
    torch.manual_seed(0)
    return MODELS.build(dict(dict(type='Vim', arch='test', img_size=48, out_type='featmap',
                                  out_indices=(-1, )), **kw)).eval()


def test_the_forward_decides_once(monkeypatch):
    """A ToMe forward builds one plan, whatever the number of blocks and steps (the
    reduction session only reads it); a block called directly builds its own."""
    builds = []
    real = execution.plan_vim

    def counted(facts, family='Vim'):
        builds.append(facts)
        return real(facts, family)
    for mod in (vim_embed, block_mod, mixer_mod):
        monkeypatch.setattr(mod, 'plan_vim', counted)
    assert not any(hasattr(session_mod, name) for name in ('plan_vim', 'plan_step', 'call_facts'))
    m = _model(token_reduction=dict(type='ToMe', ratio=0.27))
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        m(x)
        assert len(builds) == 1 and len(builds[0].blocks) == len(m.layers)
        assert len(m.last_context.steps) == 2
        h = torch.randn(2, 10, m.embed_dims)
        m.layers[0](h, None, m.embed(x)[1])
    assert len(builds) == 3        # embed(x) made one, the direct block call one


def test_cpu_inference_plan_and_its_outputs():
    """CPU fp32 inference: the compiled routes everywhere, ToMe's steps in one call; with the
    kernels switched off the plan says torch (and why) and the outputs agree."""
    if not _kernels():
        pytest.skip('the compiled CPU kernels are not built')
    m = _model(token_reduction=dict(type='ToMe', ratio=0.27))
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        plan = m.execution_plan(x)
        out = m(x)[0]
        with runtime.override(cpu_kernels=False):
            ref_plan = m.execution_plan(x)
            ref = m(x)[0]
    assert not plan.fused and plan.embed.route == 'torch'
    assert {(b.add_norm.route, b.mixer.route) for b in plan.blocks} == {('cpu', 'cpu')}
    assert [(s.block, s.match, s.merge, s.fold) for s in plan.steps] == \
        [(0, 'cpu', 'cpu', True), (2, 'cpu', 'cpu', True)]
    assert {b.mixer for b in ref_plan.blocks} == {('torch', 'AMVIM_CPU_KERNELS=0')}
    assert [(s.match, s.merge) for s in ref_plan.steps] == [('torch', 'torch')] * 2
    assert ((out - ref).abs().max() / ref.abs().max()) < 2e-6
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fused = True


def test_plan_reasons_grad_training_and_switches():
    m = _model()
    x = torch.randn(2, 3, 48, 48)
    plan = m.execution_plan(x)                       # grad mode: no compiled kernel
    assert plan.block(0).mixer == ('torch', 'grad recorded')
    assert plan.fused_why == 'not CUDA'
    with torch.no_grad(), runtime.override(fused_mixer=False):
        assert m.execution_plan(x).block(1).mixer == ('torch', 'AMVIM_FUSED_MIXER=0')
    m.mixer_fused = None
    for layer in m.layers:
        layer.mixer.fused = False
    with torch.no_grad():
        assert m.execution_plan(x).block(1).mixer == ('torch', 'fused=False')
    m.train()
    with torch.no_grad():
        steps = _model(token_reduction=dict(type='ToMe', ratio=0.27)).train().execution_plan(
            x).steps
    assert {(s.match, s.merge, s.fold) for s in steps} == {('torch', 'torch', False)}


def test_top_blocks_keep_the_inference_route():
    """ToP: the block before the step scores the tokens, every block after it scans aligned,
    both on the compiled CPU mixer in inference (from the schedule alone); under autograd the
    Triton training route leaves them to the PyTorch mixer."""
    m = _model(token_reduction=dict(type='ToP', keep_rate=0.7, locations=(1, )))
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        plan = m.execution_plan(x)
    cpu = 'cpu' if _kernels() else 'torch'
    assert [b.mixer.route for b in plan.blocks] == [cpu] * 4
    if _kernels():
        whys = [b.mixer.why for b in plan.blocks]
        assert whys == ['CPU inference', 'CPU inference with ToP importance'] + \
            ['CPU inference with hidden-state alignment'] * 2
    # the Triton routes of the same blocks (the plan's rule, as a CUDA forward would ask it)
    routes = [execution.vim._mixer(plan.facts, i, True, True) for i in range(3)]
    assert routes[0] == ('triton-train', 'grad recorded')
    assert routes[1] == ('torch', 'ToP importance under autograd')
    assert routes[2] == ('torch', 'hidden-state alignment under autograd')
    assert [execution.vim._mixer(plan.facts, i, True, False) for i in (1, 2)] == \
        [('triton', 'inference with ToP importance'),
         ('triton', 'inference with hidden-state alignment')]


def test_direct_calls_plan_for_themselves():
    """A mixer called outside a forward plans for itself by the same rules: the compiled CPU
    route at CPU inference, also for a ToP context, PyTorch under autograd or with the
    mixer's own ``fused=False``; the Triton routes of such a call (the rule a CUDA call asks)
    compute ToP's work at inference and leave it to the PyTorch mixer under autograd."""
    m = _model()
    mixer = m.layers[0].mixer
    h = torch.randn(1, 10, m.embed_dims)
    ctx = m.embed(torch.randn(1, 3, 48, 48))[1]
    cpu = 'cpu' if _kernels() else 'torch'
    with torch.no_grad():
        assert mixer.call_route(h, ctx).route == cpu
        assert mixer.use_fused(h, ctx) is False
        ctx.want_importance = True      # ToP's scores: the inference routes compute them
        assert mixer.call_route(h, ctx).route == cpu
        facts = execution.call_facts(h, mixer.mixer_facts(), execution.BlockFacts(), False,
                                     ctx=ctx)
        assert execution.vim._mixer(facts, 0, True, False).route == 'triton'
    assert mixer.call_route(h, ctx) == ('torch', 'grad recorded')
    mixer.fused = False
    with torch.no_grad():
        assert mixer.call_route(h, ctx) == ('torch', 'fused=False')
    assert execution.vim._mixer(facts, 0, True, True) == ('torch',
                                                          'ToP importance under autograd')


def test_cuda_rules_on_cpu_facts():
    """The CUDA side of the Vim rules, asked on a CPU machine with CUDA facts: the embedding
    takes the Triton kernel under 16-bit autocast and cuBLAS in float32; a grad-recording
    forward its trainable form."""
    m = _model()
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        f = m.execution_plan(x).facts
    cuda = dataclasses.replace(f, device='cuda', autocast=torch.bfloat16, embed_kernel=True)
    assert execution.vim._embed(cuda, True) == ('triton', 'inference')
    assert execution.vim._embed(dataclasses.replace(cuda, autocast=None), True).route == 'torch'
    assert execution.vim._embed(dataclasses.replace(cuda, grad_mode=True, embed_grad=True),
                                True) == ('triton-train', 'grad recorded')
