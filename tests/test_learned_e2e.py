"""Learned reducers end to end through the command-line tools (tiny data, subprocesses): train a
plain segmenter 2 iterations; fine-tune DynamicViT on it with ``tools/train.py``
(ReducerFineTuner: teacher, distillation, the warm-up freeze) and LTMP (thresholds only, no
teacher); evaluate with ``tools/test.py`` and ``tools/prune_eval.py`` (the learned rows next to
training-free ToMe)."""
import json

import pytest
import torch

from amvim_mm.testing import make_ade20k
from tests import test_tools_e2e as e2e

pytestmark = [pytest.mark.slow]

FINETUNE = """\
_base_ = [{base!r}]
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.0, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='DynamicViT', keep_rate=0.7, locations=(0, 2)))))
load_from = {ckpt!r}
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={{'student': dict(lr_mult=0.1),
                                     'student.backbone.token_reducer': dict(lr_mult=1.0)}}))
param_scheduler = []
train_cfg = dict(max_iters=4, val_interval=4)
custom_hooks = [dict(type='FrozenWarmupHook', module='student.backbone', iters=2)]
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=10))
"""


LTMP_FINETUNE = """\
_base_ = [{base!r}]
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.0, token_weight=0.0,
    train_only_reducer=True,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='LTMP', merge_init=0.6, prune_init=0.5, tau=0.1,
                             target=0.5))))
load_from = {ckpt!r}
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='SGD', lr=5e-2, momentum=0.9, weight_decay=0.0),
    paramwise_cfg=dict(custom_keys={{'prune_thresholds': dict(lr_mult=0.1)}}))
param_scheduler = []
train_cfg = dict(max_iters=3, val_interval=3)
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=10))
"""


@pytest.fixture(scope='module')
def plain_run(tmp_path_factory):
    root = tmp_path_factory.mktemp('e2e_learned')
    data_root = make_ade20k(root / 'ade', num_train=4, num_val=2, seed=0)
    plain = e2e.write_config(root / 'vim-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py',
                             e2e.SEG_CONFIG.format(base=e2e.SEG_BASE, data_root=data_root))
    e2e.run_tool(['train.py', plain], cwd=root)
    return root, plain, e2e._work_dir(root, plain) / 'iter_2.pth'


@pytest.fixture(scope='module')
def finetuned(plain_run):
    root, plain, plain_ckpt = plain_run
    cfg = e2e.write_config(root / 'vim-test_pyramid_upernet_1xb2-4i_ade20k-64x64_dynamicvit.py',
                           FINETUNE.format(base=str(plain), ckpt=str(plain_ckpt)))
    _, out = e2e.run_tool(['train.py', cfg], cwd=root)
    return dict(root=root, plain=plain, plain_ckpt=plain_ckpt, cfg=cfg, out=out,
                work=e2e._work_dir(root, cfg))


def _sweep_learned(root, cfg, ckpt, tmp_path, reducer):
    """``prune_eval`` with the learned row and ToMe at ratios 0 / 0.3: the results and the
    one learned row (labelled with the reducer in the printed table)."""
    out_dir = tmp_path / 'sweep'
    _, out = e2e.run_tool(['prune_eval.py', cfg, ckpt, '--methods', 'learned', 'tome',
                           '--ratios', '0', '0.3', '--out-dir', out_dir, '--replicates', '50',
                           '--threads', '1'], cwd=root)
    assert f'{reducer} (fine-tuned ' in out and ' iterations)' in out, out[-3000:]
    data = json.loads((out_dir / 'results.json').read_text())
    learned = [r for r in data['results'] if r['method'] == 'learned']
    assert len(learned) == 1 and learned[0]['reduction']['type'] == reducer
    return data, learned[0]


def _sd(path):
    return torch.load(path, map_location='cpu', weights_only=False)['state_dict']


def test_finetune_logs_the_losses_and_keeps_the_teacher(finetuned):
    out = finetuned['out']
    for term in ('loss_keep_ratio', 'loss_distill_tokens', 'decode.loss_ce'):
        assert term in out, out[-3000:]
    plain = _sd(finetuned['plain_ckpt'])
    last = _sd(finetuned['work'] / 'iter_4.pth')
    backbone = [k for k in plain if k.startswith('backbone.')]
    assert backbone
    # the teacher is the plain model, unchanged; the student moved after the warm-up
    for k in backbone:
        assert torch.equal(last['teacher.' + k], plain[k]), k
    assert any(not torch.equal(last['student.' + k], plain[k]) for k in backbone
               if plain[k].is_floating_point())
    assert any(k.startswith('student.backbone.token_reducer.predictors.1.') for k in last)


def test_warmup_freeze_holds_the_backbone_but_not_the_predictors(finetuned):
    plain = _sd(finetuned['plain_ckpt'])
    one, two, three = (_sd(finetuned['work'] / f'iter_{i}.pth') for i in (1, 2, 3))
    for k in (k for k in plain if k.startswith('backbone.')):
        assert torch.equal(two['student.' + k], plain[k]), k          # held for 2 iterations
    pred = [k for k in two if '.token_reducer.' in k and k.startswith('student.')]
    assert any(not torch.equal(one[k], two[k]) for k in pred)        # predictors train
    assert any(not torch.equal(three['student.' + k], plain[k])
               for k in plain if k.startswith('backbone.layers.'))   # released at iteration 3


def test_finetuned_model_tests_and_sweeps(finetuned, tmp_path):
    root, cfg = finetuned['root'], finetuned['cfg']
    ckpt = finetuned['work'] / 'iter_4.pth'
    _, out = e2e.run_tool(['test.py', cfg, ckpt], cwd=root)
    tested = e2e.printed_metrics(out)['mIoU']
    # the student exported alone (teacher dropped) tests the same
    student = tmp_path / 'student.pth'
    e2e.run_tool(['model_converters/export_student.py', ckpt, student], cwd=root)
    sd = _sd(student)
    assert not any(k.startswith(('teacher.', 'student.')) for k in sd)
    assert any(k.startswith('backbone.token_reducer.') for k in sd)
    _, out = e2e.run_tool(['test.py', cfg, student], cwd=root)
    assert e2e.printed_metrics(out)['mIoU'] == tested
    data, learned = _sweep_learned(root, cfg, ckpt, tmp_path, 'DynamicViT')
    rows = {(r['method'], r['ratio']) for r in data['results']}
    assert learned['fine_tuned'] == 'fine-tuned 4 iterations'
    # 16 patches (64x64, patch 16): int(16 * 0.7) = 11 kept after block 0, int(16 * 0.49) = 7
    # after block 2
    assert learned['final_tokens'] == 7
    assert learned['reduction']['type'] == 'DynamicViT'
    # the sweep evaluates CHECKPOINT, not the config's load_from (the plain model it started
    # from): its learned row is what tools/test.py measured
    assert learned['metric'] == pytest.approx(float(tested), abs=0.01)
    assert ('tome', 0.3) in rows and ('tome', 0.0) in rows


def test_prune_eval_learned_needs_a_learned_config(finetuned, tmp_path):
    root = finetuned['root']
    rc, out = e2e.run_tool(['prune_eval.py', finetuned['plain'], finetuned['plain_ckpt'],
                            '--methods', 'learned', '--ratios', '0', '--out-dir',
                            tmp_path / 'x'], cwd=root, check=False)
    errors = [ln for ln in out.splitlines() if ln.startswith('error:')]
    assert rc == 2 and len(errors) == 1 and 'learned reducer' in errors[0], out[-2000:]


def test_ltmp_finetune_moves_the_thresholds_and_sweeps(plain_run, tmp_path):
    root, plain, plain_ckpt = plain_run
    cfg = e2e.write_config(root / 'vim-test_pyramid_upernet_1xb2-3i_ade20k-64x64_ltmp.py',
                           LTMP_FINETUNE.format(base=str(plain), ckpt=str(plain_ckpt)))
    _, out = e2e.run_tool(['train.py', cfg], cwd=root)
    assert 'loss_flops' in out and 'flops_ratio' in out, out[-3000:]
    work = e2e._work_dir(root, cfg)
    one, three = _sd(work / 'iter_1.pth'), _sd(work / 'iter_3.pth')
    plain_sd = _sd(plain_ckpt)
    thr = [k for k in three if k.endswith('.threshold')]
    assert len(thr) == 6 and not any(k.startswith('teacher.') for k in three)
    assert any(not torch.equal(one[k], three[k]) for k in thr)        # the thresholds move
    for k in (k for k in plain_sd if k.startswith('backbone.')):
        assert torch.equal(three['student.' + k], plain_sd[k]), k    # nothing else trains
    ckpt = work / 'iter_3.pth'
    _, out = e2e.run_tool(['test.py', cfg, ckpt], cwd=root)
    tested = e2e.printed_metrics(out)['mIoU']
    data, learned = _sweep_learned(root, cfg, ckpt, tmp_path, 'LTMP')
    assert learned['metric'] == pytest.approx(float(tested), abs=0.01)
    # per-image token counts: the GFLOPs and the realised ratio are means over the images
    zero = next(r for r in data['results'] if r['ratio'] == 0)
    assert learned['gflops'] < zero['gflops'] and 0 < learned['realised_ratio'] < 1
