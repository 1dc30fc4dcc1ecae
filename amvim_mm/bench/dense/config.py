"""The dense suite's workloads, implementations, recipes pinned from the configs, sizes and
command-line options (see :mod:`amvim_mm.bench.dense`)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

from amvim_mm.errors import ConfigError

WORKLOADS = {
    'ade-train': 'ADE20K UperNet training step (bf16 autocast, loss.backward, AdamW step)',
    'ade-slide': "ADE20K UperNet slide inference (the config's test_cfg; logits + argmax)",
    'ade-whole': 'ADE20K UperNet whole-image inference (logits + argmax)',
    'ade-backbone': "the ADE20K UperNet's backbone alone, inference (its four feature maps)",
    'coco': 'COCO Mask R-CNN backbone + simple feature pyramid, forward + backward',
    'in1k': 'ImageNet fine-tuning step (backbone + linear head, AdamW, bf16 autocast)',
}
TRAINING = ('ade-train', 'coco', 'in1k')
#: how inference rows can be timed (``--infer-modes``); training rows are always eager
INFER_MODES = ('eager', 'graph')
#: impl -> the backbones' ``fused_mixer`` (the peer has no mixer)
IMPLS = {'auto': None, 'unfused': False, 'forced': True, 'auto-graphs': None,
         'unfused-graphs': False}
#: impls whose backbone replays its forwards from CUDA graphs (``cuda_graph=True``) inside the
#: eager pipeline (eager inference rows only), and the impl each is divided by
GRAPH_IMPLS = {'auto-graphs': 'unfused-graphs', 'unfused-graphs': None}
ADE_CONFIGS = {
    'vim': 'configs/vim/vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py',
    'amvim': 'configs/amvim/amvim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py',
    'vim-segmenter': 'configs/vim/vim-t_segmenter-mask_8xb1-160k_ade20k-512x512.py',
}
#: the suite's models (``--models``): our UperNets, mmseg's ViT with the same neck and heads,
#: and Vim-T with Segmenter's mask transformer on the kept tokens (``out_type='tokens'``; ADE20K
#: inference workloads only: it has no training, COCO or ImageNet row)
MODELS = ('vim', 'amvim', 'peer', 'vim-segmenter')
#: models that only run the ADE20K inference workloads
ADE_INFER_ONLY = ('vim-segmenter', )
#: the reduction methods of the inference rows (``--methods``; prune_eval's names and its
#: mapping of a ratio to a reducer: :func:`amvim_mm.apis.sweep.methods.reduction_config`)
METHODS = ('tome', 'evit', 'top', 'random')
#: the Vim-T / AMVim-T Mask R-CNN configs' ``model.backbone`` (without ``init_cfg``; the type is
#: set per model) and ``model.neck``. Pinned here because those configs' ``mmdet::`` bases need
#: mmdet, which the GPU job does not install; tests/test_dense_benchmark.py checks them against
#: configs/{vim,amvim}/*-t_sfp_mask-rcnn_8xb8-lsj-184k_coco-1024x1024.py.
COCO_BACKBONE = dict(arch='tiny', img_size=1024, out_type='featmap', out_indices=(23, ),
                     with_cls_token=False, final_norm=False, drop_path_rate=0.1)
COCO_NECK = dict(type='SimpleFeaturePyramid', in_channels=192, out_channels=256,
                 scales=(4, 2, 1, 0.5), norm_cfg=dict(type='LN2d'), num_outs=5)
#: configs/amvim/amvim-t_linear_8xb128-150e_in1k-224.py's backbone (without ``init_cfg``),
#: optimizer wrapper and head, pinned for the same reason (``mmpretrain::`` bases; checked by
#: the same test). The head is ``LinearClsHead``: a linear layer on the class token with
#: ``LabelSmoothLoss(label_smooth_val=0.1, mode='original')`` = cross-entropy with
#: ``label_smoothing=0.1``; Mixup / CutMix (batch augments of the data preprocessor) are data
#: work and not timed.
IN1K_BACKBONE = dict(arch='tiny', img_size=224, out_type='cls_token', drop_path_rate=0.05)
IN1K_OPTIM = dict(type='OptimWrapper',
                  optimizer=dict(type='AdamW', lr=4e-5, weight_decay=0.05, eps=1e-8,
                                 betas=(0.9, 0.999)),
                  constructor='LayerDecayOptimWrapperConstructor',
                  paramwise_cfg=dict(layer_decay_rate=1.0))
IN1K_HEAD = dict(num_classes=1000, label_smooth_val=0.1)
#: ToP-ViM's Tiny protocol (README: keep 0.8 after blocks 9 and 19 of 24)
TOP_KEEP_RATE = 0.8
TOME_RATIOS = (0.17, 0.46)
PEER_NOTE = ("mmseg VisionTransformer (class token, LN eps 1e-6, GELU, mlp 4, qkv bias); its "
             "attention is mmcv's MultiheadAttention wrapper around torch.nn.MultiheadAttention, "
             "called with need_weights=True: an explicit softmax, not a fused SDPA kernel")


@dataclasses.dataclass(frozen=True)
class DenseSizes:
    """The sizes of one run of the suite: :data:`FULL` (the GPU) or :data:`SMOKE` (the CPU)."""

    arch: str
    peer: dict
    ade_crop: int
    ade_stride: int
    ade_train_batch: int
    slide_batches: Tuple[int, ...]
    whole: Tuple[Tuple[int, int], ...]
    coco_res: int
    coco_batch: int
    in1k_res: int
    in1k_batch: int
    warmup: int
    train_iters: int
    infer_iters: int
    repeats: int


FULL = DenseSizes(
    arch='tiny', peer=dict(embed_dims=192, num_layers=12, num_heads=3),
    ade_crop=512, ade_stride=341, ade_train_batch=8, slide_batches=(1, 8),
    whole=((512, 8), (768, 4), (1024, 2)), coco_res=1024, coco_batch=2, in1k_res=224,
    in1k_batch=128, warmup=3, train_iters=5, infer_iters=10, repeats=3)
SMOKE = DenseSizes(
    arch='test', peer=dict(embed_dims=32, num_layers=4, num_heads=2),
    ade_crop=64, ade_stride=43, ade_train_batch=2, slide_batches=(1, 2),
    whole=((64, 2), (96, 1)), coco_res=64, coco_batch=1, in1k_res=64, in1k_batch=2,
    warmup=1, train_iters=1, infer_iters=1, repeats=2)


# ------------------------------------------------------------------------------ arguments
def parse_whole_sizes(text: str) -> Tuple[Tuple[int, int], ...]:
    """``'512:8,768:4'`` -> ((512, 8), (768, 4)); a :class:`ConfigError` otherwise."""
    out = []
    for item in text.replace(' ', ',').split(','):
        if not item:
            continue
        try:
            res, batch = (int(v) for v in item.split(':'))
            if res < 16 or batch < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f'--whole-sizes expects RES:BATCH pairs (RES >= 16, BATCH >= 1) '
                              f'separated by commas, e.g. 512:8,768:4; got {item!r}') from None
        out.append((res, batch))
    if not out:
        raise ConfigError('--whole-sizes is empty; give RES:BATCH pairs, e.g. 512:8,768:4')
    return tuple(out)


def _positive(name: str, text: Optional[str], kind: type = int, minimum: float = 1):
    if text is None:
        return None
    try:
        value = kind(text)
        if value < minimum or value != value:
            raise ValueError
    except ValueError:
        raise ConfigError(f'{name} expects a {"number" if kind is float else "whole number"} '
                          f'>= {minimum}, got {text!r}') from None
    return value


def resolve_options(*, smoke: bool, workloads: Optional[Sequence[str]] = None,
                    whole_sizes: Optional[str] = None, budget_s: Optional[str] = None,
                    repeats: Optional[str] = None, warmup: Optional[str] = None,
                    train_iters: Optional[str] = None, infer_iters: Optional[str] = None,
                    infer_modes: Optional[Sequence[str]] = None, cuda: bool
                    ) -> Tuple[DenseSizes, List[str], Optional[float], Tuple[str, ...]]:
    """Check the suite's command-line options; return (sizes, workloads, budget in s,
    inference modes).

    Every problem is a one-line :class:`ConfigError` (exit code 2 through ``run_cli``)."""
    if not smoke and not cuda:
        raise ConfigError('--suite dense needs a CUDA device; --smoke runs it at tiny sizes '
                          'on the CPU')
    chosen = list(workloads or WORKLOADS)
    for w in chosen:
        if w not in WORKLOADS:
            raise ConfigError(f'unknown dense workload {w!r}; choose from '
                              f'{", ".join(WORKLOADS)}')
    sizes = SMOKE if smoke else FULL
    changes = {}
    if whole_sizes is not None:
        changes['whole'] = parse_whole_sizes(whole_sizes)
    for field, name, text in (('repeats', '--repeats', repeats),
                              ('warmup', '--warmup', warmup),
                              ('train_iters', '--train-iters', train_iters),
                              ('infer_iters', '--infer-iters', infer_iters)):
        value = _positive(name, text)
        if value is not None:
            changes[field] = value
    if changes.get('repeats', sizes.repeats) < 2:
        raise ConfigError('--repeats must be at least 2 (the rows report a spread)')
    budget = _positive('--budget-s', budget_s, float, 1)
    modes = tuple(dict.fromkeys(infer_modes or ('eager', )))
    for m in modes:
        if m not in INFER_MODES:
            raise ConfigError(f'unknown inference mode {m!r}; choose from '
                              f'{", ".join(INFER_MODES)}')
    return dataclasses.replace(sizes, **changes), chosen, budget, modes


def resolve_models(models: Optional[Sequence[str]], methods: Optional[Sequence[str]],
                   ratios: Optional[Sequence[str]]
                   ) -> Tuple[Tuple[str, ...], Tuple[Tuple[str, float], ...]]:
    """Check ``--models``, ``--methods`` and ``--ratios``; return (models, the inference rows'
    (method, ratio) pairs). Defaults: our UperNets and the peer; ToMe at
    :data:`TOME_RATIOS`."""
    chosen = tuple(dict.fromkeys(models or MODELS[:3]))
    for m in chosen:
        if m not in MODELS:
            raise ConfigError(f'unknown dense model {m!r}; choose from {", ".join(MODELS)}')
    names = tuple(dict.fromkeys(methods or ('tome', )))
    for m in names:
        if m not in METHODS:
            raise ConfigError(f'unknown reduction method {m!r}; choose from '
                              f'{", ".join(METHODS)}')
    values = []
    for text in ratios or [str(r) for r in TOME_RATIOS]:
        value = _positive('--ratios', text, float, 0)
        if not 0 < value < 1:
            raise ConfigError(f'--ratios expects numbers between 0 and 1 (the share of '
                              f'tokens removed), got {text!r}')
        values.append(value)
    return chosen, tuple((m, r) for m in names for r in dict.fromkeys(values))
