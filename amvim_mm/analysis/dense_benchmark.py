"""The dense-task benchmark suite (``python tools/benchmark.py --suite dense``).

Why: the classifier benchmarks (``--suite gpu``) time whole ImageNet models at batch 128; the
dense tasks the configs are written for run other shapes (512-1024 px, batch 1-8, a UperNet or
feature-pyramid head, training steps with an optimizer), where our paths and a transformer of
the same size may rank differently. Every workload times, side by side in one process on the
same input tensors and the same starting weights:

* ``auto``: our model with ``fused_mixer=None`` (the automatic choice: the fused Triton path for
  CUDA inference at batch x inner width >= 16 x 384 when mamba-ssm is there; training takes it
  too once the fused path supports gradients);
* ``unfused``: ``fused_mixer=False`` (the mamba-ssm / causal-conv1d kernels when built, else the
  PyTorch ones: the official code's speed);
* ``forced`` (inference only): ``fused_mixer=True``, the fused path whatever the batch size
  (the automatic choice takes the unfused kernels at these small batches);
* ``auto-graphs`` / ``unfused-graphs`` (eager inference rows): ``auto`` / ``unfused`` with the
  backbone's ``cuda_graph=True`` (:mod:`amvim_mm.models.backbones.graphs`): the pipeline stays
  eager, the backbone's forward is replayed from a CUDA graph (captured in the warm-up). Their
  ``fused_over_unfused`` divides one by the other (both graphed); ``over_unfused_no_graphs``
  divides ``auto-graphs`` by the plain eager ``unfused`` row: what a user of the official
  code's speed gains by switching both on;
* ``peer``: mmseg's ``VisionTransformer`` at DeiT-T size (embed 192, depth 12, heads 3, patch
  16) with the same neck and heads, no token reduction.

Which path actually ran is recorded per row (``path_ran``, ``fused_calls``): one warm-up call
runs under :class:`PathProbe`, which asks every mixer call for its decision
(:meth:`~amvim_mm.models.backbones.mixer.BiMambaMixer.use_fused` and the per-call conditions its
forward adds) and counts the calls of the fused mixer function as a cross-check.

Workloads (``--workloads``):

* ``ade-train``: the UperNet built from ``configs/{vim,amvim}/*-t_pyramid_upernet_8xb2-160k_
  ade20k-512x512.py`` through mmseg's ``MODELS`` (SyncBN reverted to BN as mmengine's Runner does
  on one process), 512 x 512, batch 8: ``model(x, samples, mode='loss')`` under bf16 autocast,
  ``parse_losses``, ``backward``, the config's AdamW (layer-wise decay constructor) ``step``;
* ``ade-slide``: the same model, the config's slide inference (crop 512, stride 341: one window
  per 512 x 512 image), batch 1 and 8 (= 1 and 8 windows per forward), logits + argmax;
* ``ade-whole``: whole-image inference at 512 / 768 / 1024 (batch 8 / 4 / 2 by default: about
  the same pixels per batch; ``--whole-sizes``), logits + argmax;
* ``ade-backbone``: the same UperNet's backbone alone (its four feature maps), at the slide
  rows' and the whole rows' sizes: the backbone-only figures next to the end-to-end ones. The
  whole rows then carry ``backbone_share`` (backbone ms / whole ms, same model, path, size and
  mode) and the fused rows ``ratio_cap``: the unfused whole row's ms over its time outside the
  backbone (neck, heads, resize, argmax: the same work on both paths), the fused / unfused
  ratio a backbone that took no time would give;
* ``coco``: the Vim-T Mask R-CNN config's backbone and simple feature pyramid only (no mmdet),
  1024 x 1024, batch 2, forward + backward of the sum of the level means (no optimizer step);
* ``in1k``: the AMVim-T ImageNet fine-tuning recipe (backbone + linear head, label smoothing
  0.1, AdamW lr 4e-5 wd 0.05 through the layer-decay constructor), 224, batch 128; Vim-T is run
  with the same recipe (only the backbone type differs).

Token reduction: ToMe at ratios 0.17 and 0.46 for the inference rows, ToP (ToP-ViM's Tiny
protocol: keep 0.8 after blocks 9 and 19, scaled to the depth) for the training rows; the
unreduced rows of every workload run first, so a short budget drops reduction rows first.

Timing: all inputs are made once on the device before a row (no data generation in the
timings), ``warmup`` calls (the first under the probe), then ``repeats`` timings of ``iters``
calls each with CUDA events (``perf_counter`` after the work on the CPU); the row reports the
median and the spread (max - min) / median. Training rows are eager (an optimizer step with
host-side work). Inference rows run in the modes of ``--infer-modes`` (default ``eager``):
``graph`` captures the timed call in one CUDA graph after the eager warm-up (the probe's call
is eager) and times its replays, so every path, the peer included, runs without Python and
launch overhead; ratios only ever divide rows of the same mode. mmseg's slide inference checks
its window counts on the host, which a graph cannot capture: its graph rows capture the
windows' forward (``encode_decode`` of the batch of windows, what slide inference runs per
window batch; at crop = image size there is one window per image). Peak memory is
``torch.cuda.max_memory_allocated`` after a reset before the row's first call, less the memory
of the other models kept for later rows: the row's weights, inputs, optimizer state and
activations (``device_peak_mib``: the raw maximum). ``--smoke`` runs every row at tiny sizes
on the CPU (``arch='test'`` backbones, a 4-layer peer, 64-96 px, batch 1-2, 2 repeats of one
call) for tests; the ``forced`` rows need ``TRITON_INTERPRET=1`` there (Triton's
interpreter), else they are recorded as skipped.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import importlib
import json
import os
import os.path as osp
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    'vim': 'configs/vim/vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py',
    'amvim': 'configs/amvim/amvim-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py',
}
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


# ------------------------------------------------------------------------------ path probe
class PathProbe:
    """Record which path every mixer call of one step takes (a context manager).

    Each :class:`~amvim_mm.models.backbones.mixer.BiMambaMixer` call is asked for its decision
    in a forward pre-hook, as its forward takes it: the ``fused`` flag the block passes (the
    backbone's one decision per forward), else :meth:`use_fused`, then the per-call conditions
    (ToP's importance scores and alignment need the unfused path). The calls of the fused
    mixer functions (inference and training) are counted as a cross-check (``path_note`` when
    they disagree). Used for one warm-up call only: the hooks cost Python time.
    """

    def __init__(self, model: nn.Module) -> None:
        from amvim_mm.models.backbones.mixer import BiMambaMixer
        self.mixers = [m for m in model.modules() if isinstance(m, BiMambaMixer)]
        self.decisions: List[Optional[bool]] = []
        self.backends: set = set()
        self.kernel_calls = 0
        #: whether the fused mixer function could be wrapped to count its calls
        self.counting = False
        self.errors: List[str] = []
        self._handles: list = []
        self._saved = None

    def __enter__(self) -> 'PathProbe':
        from amvim_mm.models.backbones import mixer as mixer_module
        self._handles = [m.register_forward_pre_hook(self._pre, with_kwargs=True)
                         for m in self.mixers]
        # the inference and the training entry of the fused mixer
        names = ('fused_mixer_forward', 'fused_mixer_train')
        saved = [(n, getattr(mixer_module, n, None)) for n in names]
        if all(f is not None for _, f in saved) and self.mixers:
            for name, original in saved:
                def counted(*args, _original=original, **kwargs):
                    self.kernel_calls += 1
                    return _original(*args, **kwargs)
                setattr(mixer_module, name, counted)
            self._saved = (mixer_module, saved)
            self.counting = True
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        if self._saved is not None:
            module, saved = self._saved
            for name, original in saved:
                setattr(module, name, original)
            self._saved = None

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        try:
            hidden = args[0] if args else kwargs['hidden']
            ctx = args[1] if len(args) > 1 else kwargs['ctx']
            flag = kwargs.get('fused', args[3] if len(args) > 3 else None)
            if flag is None:
                fused = module.use_fused(hidden, ctx)
            elif flag:
                fused = not module._ctx_needs_unfused(ctx)
            else:
                fused = False
            if not fused:
                from amvim_mm.ops.backends import resolve_scan_backend
                from amvim_mm.ops.causal_conv1d import resolve_conv_backend
                cuda = hidden.is_cuda
                conv = module.path_params(0)[0]
                self.backends.add((resolve_scan_backend(cuda, module.scan_backend),
                                   resolve_conv_backend(cuda, conv.weight.shape[-1])))
        except Exception as e:   # noqa: BLE001  (a probe must not break the row)
            fused = None
            self.errors.append(f'{type(e).__name__}: {e}'.splitlines()[0][:200])
        self.decisions.append(fused)

    def summary(self) -> Dict[str, object]:
        """``path_ran`` ('fused', 'unfused', 'mixed', 'attention' for a model without a mixer,
        'unknown'), ``fused_calls`` ('k/n' mixer calls), the unfused calls' backends."""
        if not self.mixers:
            return dict(path_ran='attention')
        n = len(self.decisions)
        known = [d for d in self.decisions if d is not None]
        k = sum(bool(d) for d in known)
        out: Dict[str, object] = dict(fused_calls=f'{k}/{n}')
        if n == 0:
            out['path_ran'] = 'unknown'      # no mixer call seen
        elif len(known) < n:
            # the probe failed on some calls: the fused function's count decides, if known
            c = self.kernel_calls
            out['path_ran'] = ('unknown' if not self.counting else 'fused' if c >= n
                               else 'mixed' if c else 'unfused')
        else:
            out['path_ran'] = 'fused' if k == n else 'unfused' if k == 0 else 'mixed'
        if self.backends:
            out['scan_backend'] = ','.join(sorted({s for s, _ in self.backends}))
            out['conv_backend'] = ','.join(sorted({c for _, c in self.backends}))
        notes = []
        if self.counting and self.kernel_calls != k and len(known) == n:
            notes.append(f'the fused mixer function ran {self.kernel_calls} times, the '
                         f'decisions say {k}')
        if self.errors:
            notes.append(f'probe failed on {len(self.errors)} calls: {self.errors[0]}')
        if notes:
            out['path_note'] = '; '.join(notes)
        return out


def set_fused_mixer(model: nn.Module, value: Optional[bool]) -> int:
    """Set every mixer's ``fused`` switch (what ``fused_mixer=`` sets at build time); returns
    how many mixers there are."""
    from amvim_mm.models.backbones.mixer import BiMambaMixer
    n = 0
    for m in model.modules():
        if isinstance(m, BiMambaMixer):
            m.fused = value
            n += 1
    return n


# ------------------------------------------------------------------------------ models
class BackboneNeck(nn.Module):
    """Backbone + neck (the detector's feature extractor without its heads)."""

    def __init__(self, backbone: nn.Module, neck: nn.Module) -> None:
        super().__init__()
        self.backbone, self.neck = backbone, neck

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.neck(self.backbone(x)))


class ClsTokenClassifier(nn.Module):
    """Backbone + linear head on the class token; ``peer=True``: an mmseg ViT built with
    ``output_cls_token=True`` (its last output is ``[feature map, class token]``)."""

    def __init__(self, backbone: nn.Module, width: int, num_classes: int,
                 peer: bool = False) -> None:
        super().__init__()
        self.backbone, self.peer = backbone, peer
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.backbone(x)[-1]
        return self.head(out[1] if self.peer else out)


def _peer_backbone(sizes: DenseSizes, img_size: int, out_indices: Tuple[int, ...],
                   **extra) -> dict:
    """mmseg's VisionTransformer at the peer's size (DeiT-T on the GPU), settings of mmseg's
    own ``upernet_vit-b16_ln_mln`` base; drop path as our dense configs (0.1); ``extra``
    overrides."""
    cfg = dict(type='VisionTransformer', img_size=(img_size, img_size), patch_size=16,
               in_channels=3, mlp_ratio=4, out_indices=out_indices, qkv_bias=True,
               drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.1, with_cls_token=True,
               norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'),
               final_norm=False, norm_eval=False, interpolate_mode='bicubic', **sizes.peer)
    cfg.update(extra)
    return cfg


def _quarter_indices(depth: int) -> Tuple[int, ...]:
    """Our Vim-T configs' out_indices (5, 11, 17, 23) of 24 blocks, for ``depth`` blocks."""
    return tuple(depth * (i + 1) // 4 - 1 for i in range(4))


def _ours_depth(sizes: DenseSizes) -> int:
    from amvim_mm.models.backbones.vim import Vim
    return Vim.arch_zoo[sizes.arch]['num_layers']


def _ours_width(sizes: DenseSizes) -> int:
    from amvim_mm.models.backbones.vim import Vim
    return Vim.arch_zoo[sizes.arch]['embed_dims']


def _seg_registry():
    """mmseg's MODELS with every mmseg module registered and 'mmseg' the default scope."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmseg')
    return MODELS


def ade_config(model: str, sizes: DenseSizes, root: str):
    """The ADE20K UperNet config of ``model`` ('vim', 'amvim' or 'peer': the Vim config with
    the peer backbone), without pretrained weights; tiny widths for the smoke sizes."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(root, ADE_CONFIGS['amvim' if model == 'amvim' else 'vim']))
    m = cfg.model
    m.pretrained = None
    m.pop('data_preprocessor', None)   # inputs are made normalised; no data work is timed
    crop = sizes.ade_crop
    m.test_cfg.update(crop_size=(crop, crop), stride=(sizes.ade_stride, sizes.ade_stride))
    if model == 'peer':
        m.backbone = _peer_backbone(sizes, crop, _quarter_indices(sizes.peer['num_layers']))
        width = sizes.peer['embed_dims']
    else:
        m.backbone.update(img_size=crop, init_cfg=None)
        if sizes.arch != 'tiny':
            m.backbone.update(arch=sizes.arch, out_indices=_quarter_indices(_ours_depth(sizes)))
        width = _ours_width(sizes)
    # the same neck and heads for every model (192 wide on the GPU, as the configs say)
    m.neck.in_channels = width
    m.decode_head.in_channels = [width] * 4
    m.auxiliary_head.in_channels = width
    if sizes.arch != 'tiny':
        m.decode_head.channels = m.auxiliary_head.channels = 16
    return cfg


def build_ade(model: str, sizes: DenseSizes, root: str, device: str):
    """(UperNet, optimizer-wrapper config) of ``model``; the peer's AdamW has one parameter
    group (the layer-decay constructor needs a backbone with ``get_layer_depth``)."""
    from mmengine.model import revert_sync_batchnorm
    registry = _seg_registry()
    cfg = ade_config(model, sizes, root)
    net = revert_sync_batchnorm(registry.build(cfg.model)).to(device)
    optim = copy.deepcopy(cfg.optim_wrapper)
    if model == 'peer':
        optim = dict(type='OptimWrapper', optimizer=optim['optimizer'])
    return net, optim


def build_coco(model: str, sizes: DenseSizes, device: str) -> nn.Module:
    """The Mask R-CNN configs' backbone + simple feature pyramid (:data:`COCO_BACKBONE`)."""
    from amvim_mm.registry import MODELS
    res = sizes.coco_res
    if model == 'peer':
        depth = sizes.peer['num_layers']
        _seg_registry()
        from mmseg.registry import MODELS as SEG
        backbone = SEG.build(_peer_backbone(sizes, res, (depth - 1, )))
        width = sizes.peer['embed_dims']
    else:
        cfg = dict(COCO_BACKBONE, type='AMVim' if model == 'amvim' else 'Vim', img_size=res)
        if sizes.arch != 'tiny':
            cfg.update(arch=sizes.arch, out_indices=(_ours_depth(sizes) - 1, ))
        backbone = MODELS.build(cfg)
        width = _ours_width(sizes)
    neck = MODELS.build(dict(COCO_NECK, in_channels=width))
    return BackboneNeck(backbone, neck).to(device)


def build_in1k(model: str, sizes: DenseSizes, device: str):
    """(classifier, optimizer-wrapper config): the AMVim-T fine-tuning recipe
    (:data:`IN1K_BACKBONE`, :data:`IN1K_OPTIM`); the peer gets the same AdamW in one group."""
    from amvim_mm.registry import MODELS
    res, optim = sizes.in1k_res, copy.deepcopy(IN1K_OPTIM)
    if model == 'peer':
        depth = sizes.peer['num_layers']
        _seg_registry()
        from mmseg.registry import MODELS as SEG
        # the classifier input is normalised, as ours (final_norm)
        backbone = SEG.build(_peer_backbone(sizes, res, (depth - 1, ), output_cls_token=True,
                                            final_norm=True))
        net = ClsTokenClassifier(backbone, sizes.peer['embed_dims'], IN1K_HEAD['num_classes'],
                                 peer=True)
        optim = dict(type='OptimWrapper', optimizer=optim['optimizer'])
    else:
        cfg = dict(IN1K_BACKBONE, type='AMVim' if model == 'amvim' else 'Vim', img_size=res)
        if sizes.arch != 'tiny':
            cfg['arch'] = sizes.arch
        net = ClsTokenClassifier(MODELS.build(cfg), _ours_width(sizes),
                                 IN1K_HEAD['num_classes'])
    return net.to(device), optim


# ------------------------------------------------------------------------------ the suite
@dataclasses.dataclass
class Case:
    """One row: a workload at one size, one model, one implementation, one reduction."""

    workload: str
    model: str            # 'vim', 'amvim' or 'peer'
    impl: str             # 'auto', 'unfused', 'forced' or 'peer'
    res: int
    batch: int
    reduction: Optional[dict] = None
    reduction_name: str = 'none'
    mode: str = 'eager'   # 'eager' or 'graph' (inference rows only)


def _model_name(model: str, sizes: DenseSizes) -> str:
    if model == 'peer':
        return 'deit-t (mmseg ViT)' if sizes.arch == 'tiny' else 'vit-test (mmseg ViT)'
    return f'{model}-t' if sizes.arch == 'tiny' else f'{model}-{sizes.arch}'


def plan_cases(sizes: DenseSizes, workloads: Sequence[str], depth: int,
               forced: bool = True, infer_modes: Sequence[str] = ('eager', )) -> List[Case]:
    """Every row, unreduced rows of all workloads first, then the reduction rows; every
    inference row once per mode of ``infer_modes``."""
    from amvim_mm.models.reduction import ReductionSchedule
    top = dict(type='ToP', keep_rate=TOP_KEEP_RATE,
               locations=tuple(ReductionSchedule.importance_locations(depth)))
    top_name = f'ToP keep {TOP_KEEP_RATE} after {top["locations"]}'
    settings = {
        'ade-train': [(sizes.ade_crop, sizes.ade_train_batch)],
        'ade-slide': [(sizes.ade_crop, b) for b in sizes.slide_batches],
        'ade-whole': list(sizes.whole),
        'ade-backbone': list(dict.fromkeys(
            [(sizes.ade_crop, b) for b in sizes.slide_batches] + list(sizes.whole))),
        'coco': [(sizes.coco_res, sizes.coco_batch)],
        'in1k': [(sizes.in1k_res, sizes.in1k_batch)],
    }
    unreduced, reduced = [], []
    for w in workloads:
        train = w in TRAINING
        impls = ['auto', 'unfused'] + ([] if train or not forced else ['forced'])
        reductions = [(top, top_name)] if train else [
            (dict(type='ToMe', ratio=r), f'ToMe {r}') for r in TOME_RATIOS]
        for mode in (['eager'] if train else infer_modes):
            graphs = [] if train or mode != 'eager' else list(GRAPH_IMPLS)
            for res, batch in settings[w]:
                for model in ('vim', 'amvim', 'peer'):
                    for impl in (['peer'] if model == 'peer' else impls + graphs):
                        unreduced.append(Case(w, model, impl, res, batch, mode=mode))
                        if model != 'peer':
                            reduced += [Case(w, model, impl, res, batch, red, name, mode)
                                        for red, name in reductions]
    return unreduced + reduced


def _autocast(device: str, dtype: str):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == 'bf16')


def _sync(device: str) -> None:
    if device == 'cuda':
        torch.cuda.synchronize()


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def time_step(step: Callable[[], object], probe_model: nn.Module, *, device: str, batch: int,
              warmup: int, iters: int, repeats: int, own_bytes: int = 0,
              graph: bool = False) -> Dict[str, object]:
    """Warm up (the first call under :class:`PathProbe`), then ``repeats`` timings of
    ``iters`` calls: images/s and ms per call (medians), spread, peak memory, the path.

    ``graph``: after the probed eager call, ``step`` is captured in one CUDA graph (after
    ``warmup - 1`` more eager calls on a side stream, at least one) and its replays are timed;
    the graph's memory pool counts in the peak.

    ``peak_mib``: ``torch.cuda.max_memory_allocated`` after a reset before the first call,
    less what was resident then but is not this row's (other models kept for later rows):
    the row's weights, inputs (``own_bytes`` of the resident memory), optimizer state and
    activations. ``device_peak_mib``: the raw maximum."""
    from amvim_mm.analysis.benchmark import _timer
    _sync(device)
    others = 0
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        others = torch.cuda.memory_allocated() - own_bytes
    with PathProbe(probe_model) as probe:
        step()
    call = step
    if graph:
        from amvim_mm.analysis.benchmark import capture_cuda_graph
        captured, _ = capture_cuda_graph(step, warmup=max(warmup - 1, 1))
        call = captured.replay
        call()
    else:
        for _ in range(warmup - 1):
            step()
    _sync(device)
    times = [_timer(call, iters, device) for _ in range(repeats)]
    med = statistics.median(times)
    out: Dict[str, object] = dict(
        img_per_s=round(batch / med, 2), ms_per_iter=round(med * 1e3, 3),
        spread_pct=round(100 * (max(times) - min(times)) / med, 2),
        times_ms=[round(t * 1e3, 3) for t in times])
    out['peak_mib'] = out['device_peak_mib'] = None
    if device == 'cuda':
        peak = torch.cuda.max_memory_allocated()
        out['peak_mib'] = round((peak - others) / 2**20, 1)
        out['device_peak_mib'] = round(peak / 2**20, 1)
    out.update(probe.summary())
    return out


class DenseSuite:
    """Run the planned rows; keep models and inputs while they are needed; write the results
    (JSON and markdown) after every row, so a run cut short keeps what it measured."""

    def __init__(self, *, sizes: DenseSizes, workloads: Sequence[str], device: str,
                 out_dir: str, root: str, command: str, budget_s: Optional[float] = None,
                 smoke: bool = False, infer_modes: Sequence[str] = ('eager', ),
                 log: Callable[[str], None] = print) -> None:
        self.sizes, self.workloads, self.device = sizes, list(workloads), device
        self.infer_modes = tuple(infer_modes)
        self.out_dir, self.root, self.log, self.smoke = out_dir, root, log, smoke
        self.dtype = 'bf16'
        self.t0 = time.perf_counter()
        self.deadline = None if budget_s is None else self.t0 + budget_s
        self.models: Dict[Tuple[str, str], object] = {}
        self.inputs: Dict[tuple, object] = {}
        self.rows: List[dict] = []
        self.skipped: List[dict] = []
        #: the seconds each row of a workload took (model builds excluded)
        self.row_cost: Dict[str, List[float]] = {}
        self.build_s = 0.0
        self.result = dict(command=command, suite='dense', smoke=smoke, device=device,
                           dtype=self.dtype, budget_s=budget_s,
                           infer_modes=list(self.infer_modes),
                           sizes=dataclasses.asdict(sizes), workloads={
                               w: WORKLOADS[w] for w in self.workloads},
                           notes=self._notes())

    # -------------------------------------------------------------------- setup
    def _notes(self) -> List[str]:
        s = self.sizes
        return [
            'impl auto: fused_mixer=None (automatic choice); unfused: fused_mixer=False; '
            'forced: fused_mixer=True (inference only); auto-graphs / unfused-graphs (eager '
            'inference rows): the same with the backbone\'s cuda_graph=True (its forward '
            'replayed from a CUDA graph in the eager pipeline; fused_over_unfused: one over '
            'the other, over_unfused_no_graphs: auto-graphs over the plain unfused row); '
            'peer: ' + PEER_NOTE,
            'path_ran / fused_calls: what the mixers decided in a probed warm-up call '
            '(mixed: some calls fused, e.g. the blocks ToP scores or aligns on the unfused path)',
            'training rows eager: forward, loss, backward and (ade, in1k) the optimizer step, '
            'gradients set to None after every step; inference rows in the modes '
            + ', '.join(self.infer_modes) + ' (graph: the call captured in one CUDA graph '
            'after an eager warm-up, its replays timed; ratios within one mode only)',
            'ade-slide in graph mode: the windows\' forward (encode_decode of the batch of '
            'windows); the host-side window bookkeeping of mmseg\'s slide inference (its '
            'count check syncs) is not capturable',
            'ade-backbone: the UperNet\'s backbone alone (four feature maps); backbone_share '
            '(ade-whole rows): backbone ms / whole ms of the same model, path, size and mode; '
            'ratio_cap (ade-whole fused rows): the unfused whole ms over its ms outside the '
            'backbone, the fused / unfused ratio with a backbone that took no time',
            f'ade-slide: crop {s.ade_crop}, stride {s.ade_stride}: one window per '
            f'{s.ade_crop} x {s.ade_crop} image, so batch = windows per forward',
            'ade-whole sizes (res:batch): ' + ', '.join(f'{r}:{b}' for r, b in s.whole),
            'ours_over_peer: img/s over the peer at the same workload, resolution and batch '
            '(the peer is never reduced); fused_over_unfused: over the unfused row of the same '
            'model and reduction; speedup_vs_unreduced: over the same model and impl without '
            'reduction',
            'the peer\'s AdamW is one parameter group (the layer-decay constructor needs '
            'get_layer_depth); the same lr, weight decay and betas',
            'weights are restored to the same starting values before every row',
        ]

    def _model(self, workload: str, model: str):
        """The model (and optimizer config) of ``workload`` and ``model``, built once; a build
        error is kept and re-raised for every row of that model."""
        kind = 'ade' if workload.startswith('ade') else workload
        key = (kind, model)
        if key not in self.models:
            torch.manual_seed(0)
            t0 = time.perf_counter()
            try:
                if kind == 'ade':
                    built = build_ade(model, self.sizes, self.root, self.device)
                elif kind == 'coco':
                    built = (build_coco(model, self.sizes, self.device), None)
                else:
                    built = build_in1k(model, self.sizes, self.device)
                net = built[0]
                # the starting weights (on the CPU: not counted in any row's memory)
                snapshot = [t.detach().to('cpu', copy=True) for t in net.state_dict().values()]
                self.models[key] = (net, built[1], snapshot)
                n = sum(p.numel() for p in net.parameters())
                self.log(f'  built {kind} {model}: {n / 1e6:.2f} M parameters')
            except Exception as e:   # noqa: BLE001  (recorded in every row of this model)
                self.models[key] = e.with_traceback(None)
            self.build_s += time.perf_counter() - t0
        got = self.models[key]
        if isinstance(got, Exception):
            raise got
        return got

    def _release(self, keep_kinds: Sequence[str]) -> None:
        """Drop the models and inputs of workloads that no remaining row needs."""
        drop = [k for k in self.models if k[0] not in keep_kinds]
        drop_inputs = [k for k in self.inputs if k[0] not in keep_kinds]
        for key in drop:
            del self.models[key]
        for key in drop_inputs:
            del self.inputs[key]
        if drop or drop_inputs:
            gc.collect()
            if self.device == 'cuda':
                torch.cuda.empty_cache()

    def _images(self, kind: str, res: int, batch: int) -> torch.Tensor:
        key = (kind, 'images', res, batch)
        if key not in self.inputs:
            g = torch.Generator(device='cpu').manual_seed(res * 1000 + batch)
            self.inputs[key] = torch.randn(batch, 3, res, res, generator=g).to(self.device)
        return self.inputs[key]

    def _labels(self, kind: str, res: int, batch: int, classes: int, dense: bool):
        key = (kind, 'labels', res, batch)
        if key not in self.inputs:
            g = torch.Generator(device='cpu').manual_seed(res * 1000 + batch + 1)
            shape = (batch, 1, res, res) if dense else (batch, )
            self.inputs[key] = torch.randint(0, classes, shape, generator=g).to(self.device)
        return self.inputs[key]

    # -------------------------------------------------------------------- steps
    def _step(self, case: Case, net: nn.Module, optim_cfg
              ) -> Tuple[Callable, dict, List[torch.Tensor]]:
        """The timed call of ``case`` on ``net``, the row's descriptive fields and the input
        tensors the call reads."""
        dev, dtype, w = self.device, self.dtype, case.workload
        kind = 'ade' if w.startswith('ade') else w
        x = self._images(kind, case.res, case.batch)
        inputs = [x]
        info: Dict[str, object] = {}
        if w in TRAINING:
            net.train()
            optimizer = None
            if optim_cfg is not None:
                from mmengine.optim import build_optim_wrapper
                wrapper = build_optim_wrapper(net, copy.deepcopy(optim_cfg))
                optimizer = wrapper.optimizer
                info['optimizer'] = (f'{type(optimizer).__name__}, '
                                     f'{len(optimizer.param_groups)} parameter groups')
            if w == 'ade-train':
                samples = self._seg_samples(case, train=True)
                inputs.append(self._labels('ade', case.res, case.batch, 150, True))

                def forward():
                    losses = net(x, samples, mode='loss')
                    return net.parse_losses(losses)[0]
                info['step'] = 'loss (mmseg EncoderDecoder), backward, optimizer step'
            elif w == 'in1k':
                y = self._labels(kind, case.res, case.batch, IN1K_HEAD['num_classes'], False)
                inputs.append(y)

                def forward():
                    return F.cross_entropy(net(x).float(), y,
                                           label_smoothing=IN1K_HEAD['label_smooth_val'])
                info['step'] = 'cross-entropy (label smoothing 0.1), backward, optimizer step'
            else:
                def forward():
                    return sum(o.float().mean() for o in net(x))
                info['step'] = 'forward, sum of the 5 levels\' means, backward (no optimizer)'

            def step():
                with _autocast(dev, dtype):
                    loss = forward()
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
                net.zero_grad(set_to_none=True)
            info['mode'] = 'train-eager'
            return step, info, inputs
        net.eval()
        info['mode'] = f'infer-{case.mode}'
        if w == 'ade-backbone':
            def step():
                with torch.no_grad(), _autocast(dev, dtype):
                    return net.backbone(x)
            info['step'] = 'backbone forward (the UperNet\'s backbone), four feature maps'
            return step, info, inputs
        mode = 'slide' if w == 'ade-slide' else 'whole'
        net.test_cfg['mode'] = mode
        metas = self._seg_samples(case, train=False)
        if mode == 'slide':
            h_crop, _ = net.test_cfg['crop_size']
            h_stride, _ = net.test_cfg['stride']
            grids = (max(case.res - h_crop + h_stride - 1, 0) // h_stride + 1) ** 2
            info['windows_per_forward'] = grids * case.batch
        if mode == 'slide' and case.mode == 'graph':
            if case.res != h_crop:
                raise ConfigError('graph-mode slide rows need the image size to equal the '
                                  f'crop ({h_crop}): one window per image')

            def step():
                with torch.no_grad(), _autocast(dev, dtype):
                    return net.encode_decode(x, metas).argmax(1)
            info['step'] = 'the windows\' forward (encode_decode), logits + argmax'
            return step, info, inputs

        def step():
            with torch.no_grad(), _autocast(dev, dtype):
                return net.inference(x, metas).argmax(1)
        info['step'] = f'{mode} inference (mmseg), logits + argmax'
        return step, info, inputs

    def _seg_samples(self, case: Case, train: bool):
        """Training: SegDataSamples with random ground truth; inference: image metas."""
        res = case.res
        meta = dict(img_shape=(res, res), ori_shape=(res, res), pad_shape=(res, res))
        if not train:
            return [dict(meta) for _ in range(case.batch)]
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        labels = self._labels('ade', res, case.batch, 150, True)
        return [SegDataSample(gt_sem_seg=PixelData(data=labels[i]), metainfo=dict(meta))
                for i in range(case.batch)]

    # -------------------------------------------------------------------- rows
    def run_case(self, case: Case) -> dict:
        """Measure one row (errors are recorded in it, not raised)."""
        s = self.sizes
        row: Dict[str, object] = dict(
            workload=case.workload, model=_model_name(case.model, s), impl=case.impl,
            reduction=case.reduction_name, res=case.res, batch=case.batch, dtype=self.dtype,
            mode=f'{"train" if case.workload in TRAINING else "infer"}-{case.mode}',
            fused_mixer=str(IMPLS[case.impl]) if case.impl in IMPLS else None,
            backbone_cuda_graph=case.impl in GRAPH_IMPLS)
        net = None
        try:
            net, optim_cfg, snapshot = self._model(case.workload, case.model)
            with torch.no_grad():
                for t, v in zip(net.state_dict().values(), snapshot):
                    t.copy_(v)
            if case.model != 'peer':
                set_fused_mixer(net, IMPLS[case.impl])
                backbone = net.backbone
                backbone.cuda_graph = case.impl in GRAPH_IMPLS or None
                backbone.set_token_reduction(case.reduction)
            step, info, inputs = self._step(case, net, optim_cfg)
            row.update(info)
            iters = s.train_iters if case.workload in TRAINING else s.infer_iters
            own = tensor_bytes(list(net.parameters()) + list(net.buffers()) + inputs)
            row.update(time_step(step, net, device=self.device, batch=case.batch,
                                 warmup=s.warmup, iters=iters, repeats=s.repeats,
                                 own_bytes=own, graph=case.mode == 'graph'))
            row.update(warmup=s.warmup, iters=iters, repeats=s.repeats)
            if case.reduction is not None:
                row['token_counts'] = list(getattr(backbone, 'token_counts', []))
        except Exception as e:   # noqa: BLE001  (one failing row must not lose the run)
            msg = str(e).strip().splitlines()
            row['error'] = f'{type(e).__name__}: {msg[0][:300]}' if msg else type(e).__name__
            step = None
            gc.collect()     # the traceback's frames hold the row's tensors
        finally:
            if net is not None:
                net.zero_grad(set_to_none=True)
                if case.model != 'peer':
                    net.backbone.set_token_reduction(None)
                    set_fused_mixer(net, None)
                    net.backbone.cuda_graph = None
                    net.backbone.reset_cuda_graphs()
                    if case.impl in GRAPH_IMPLS:
                        g = net.backbone._graphs.stats
                        row['backbone_graphs'] = f'{g["capture"]} captured, {g["replay"]} replays'
                        g.clear()
            if self.device == 'cuda':
                torch.cuda.empty_cache()
        return row

    def _skip_reason(self, case: Case) -> Optional[str]:
        if case.mode == 'graph' and self.device != 'cuda':
            return 'CUDA graphs need a CUDA device'
        if case.impl == 'forced':
            from amvim_mm.ops.fused_mixer import fused_mixer_available
            ok, why = fused_mixer_available(self.device)
            if not ok:
                return ('the fused path runs on the CPU in Triton\'s interpreter only '
                        '(TRITON_INTERPRET=1 before Python starts)' if self.device == 'cpu'
                        else f'the fused path is not usable: {why}')
        if self.deadline is not None:
            left = self.deadline - time.perf_counter()
            # the median, not the longest: a workload's first rows also compile kernels
            need = statistics.median(self.row_cost.get(case.workload, [0.0]))
            if left <= need or left <= 0:
                return (f'time budget: {max(left, 0):.0f} s left, a {case.workload} row '
                        f'takes about {need:.0f} s')
        return None

    def run(self, cases: Sequence[Case]) -> dict:
        """Run ``cases`` in order; returns the result dict (also written to ``out_dir``)."""
        from amvim_mm.analysis.benchmark import environment
        self.result['environment'] = dict(environment(), **stack_versions())
        self.log(f'environment: {self.result["environment"]}')
        self.log(f'dense suite: {len(cases)} rows on {self.device}'
                 + (f', budget {self.deadline - self.t0:.0f} s' if self.deadline else ''))
        kinds_left = [('ade' if c.workload.startswith('ade') else c.workload) for c in cases]
        for i, case in enumerate(cases):
            self._release(set(kinds_left[i:]))
            label = (f'{case.workload} {case.res}px b{case.batch} {case.model} {case.impl} '
                     f'{case.reduction_name}' + (' graph' if case.mode == 'graph' else ''))
            why = self._skip_reason(case)
            if why is not None:
                self.skipped.append(dict(
                    workload=case.workload, model=_model_name(case.model, self.sizes),
                    impl=case.impl, reduction=case.reduction_name, res=case.res,
                    batch=case.batch, mode=case.mode, reason=why))
                self.log(f'  [{i + 1}/{len(cases)}] {label}: skipped ({why})')
                continue
            t, built = time.perf_counter(), self.build_s
            row = self.run_case(case)
            cost = time.perf_counter() - t - (self.build_s - built)
            self.row_cost.setdefault(case.workload, []).append(cost)
            row['row_wall_s'] = round(cost, 2)
            self.rows.append(row)
            self.log(f'  [{i + 1}/{len(cases)}] {label}: '
                     + (f'{row.get("img_per_s")} img/s, {row.get("ms_per_iter")} ms, '
                        f'{row.get("peak_mib")} MiB, path {row.get("path_ran")} '
                        f'({row.get("fused_calls", "-")})' if 'error' not in row
                        else f'ERROR {row["error"]}'))
            self.write()
        self._release(())
        self.write()
        return self.result

    # -------------------------------------------------------------------- output
    def write(self) -> None:
        add_ratios(self.rows)
        self.result.update(rows=self.rows, skipped=self.skipped,
                           wall_s=round(time.perf_counter() - self.t0, 1))
        os.makedirs(self.out_dir, exist_ok=True)
        path = osp.join(self.out_dir, 'benchmark_dense.json')
        tmp = path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(self.result, f, indent=1)
        os.replace(tmp, path)
        with open(osp.join(self.out_dir, 'benchmark_dense.md'), 'w') as f:
            f.write(markdown(self.result) + '\n')


def _ratio(a, b) -> Optional[float]:
    return round(a / b, 3) if a and b else None


def add_ratios(rows: List[dict]) -> None:
    """Add ``fused_over_unfused``, ``ours_over_peer``, ``mem_over_peer`` and
    ``speedup_vs_unreduced`` (images/s quotients, 3 decimals) to the rows that have the row
    to compare with in ``rows`` (always of the same mode), and to the ade-whole rows with an
    ade-backbone row of the same size ``backbone_share`` and (fused rows) ``ratio_cap``."""
    def key(r, **over):
        k = dict(workload=r['workload'], res=r['res'], batch=r['batch'], model=r['model'],
                 impl=r['impl'], reduction=r['reduction'], mode=r.get('mode'))
        k.update(over)
        return tuple(sorted(k.items()))
    index = {key(r): r for r in rows if r.get('img_per_s')}
    peers = {(r['workload'], r['res'], r['batch'], r.get('mode')): r for r in rows
             if r['impl'] == 'peer' and r.get('img_per_s')}
    for r in rows:
        if not r.get('img_per_s') or r['impl'] == 'peer':
            continue
        if r['impl'] in GRAPH_IMPLS:
            base_impl = GRAPH_IMPLS[r['impl']]
            if base_impl is not None:
                base = index.get(key(r, impl=base_impl))
                r['fused_over_unfused'] = _ratio(r['img_per_s'], base and base['img_per_s'])
            plain = index.get(key(r, impl='unfused'))
            # the user-visible gain: a graphed backbone against the plain eager unfused one
            r['over_unfused_no_graphs'] = _ratio(r['img_per_s'], plain and plain['img_per_s'])
        elif r['impl'] != 'unfused':
            base = index.get(key(r, impl='unfused'))
            r['fused_over_unfused'] = _ratio(r['img_per_s'], base and base['img_per_s'])
        if r['workload'] == 'ade-whole':
            bb = index.get(key(r, workload='ade-backbone'))
            if bb is not None:
                r['backbone_share'] = round(bb['ms_per_iter'] / r['ms_per_iter'], 3)
            base_impl = GRAPH_IMPLS.get(r['impl'], 'unfused')
            whole = index.get(key(r, impl=base_impl))
            bb = index.get(key(r, workload='ade-backbone', impl=base_impl))
            if base_impl and r['impl'] != 'unfused' and whole is not None and bb is not None:
                rest = whole['ms_per_iter'] - bb['ms_per_iter']
                r['ratio_cap'] = round(whole['ms_per_iter'] / rest, 3) if rest > 0 else None
        peer = peers.get((r['workload'], r['res'], r['batch'], r.get('mode')))
        if peer is not None:
            r['ours_over_peer'] = _ratio(r['img_per_s'], peer['img_per_s'])
            r['mem_over_peer'] = _ratio(r.get('peak_mib'), peer.get('peak_mib'))
        if r['reduction'] != 'none':
            base = index.get(key(r, reduction='none'))
            r['speedup_vs_unreduced'] = _ratio(r['img_per_s'], base and base['img_per_s'])


COLUMNS = ['model', 'impl', 'reduction', 'mode', 'path_ran', 'fused_calls', 'res', 'batch',
           'dtype', 'img_per_s', 'ms_per_iter', 'spread_pct', 'peak_mib', 'fused_over_unfused',
           'ours_over_peer', 'mem_over_peer', 'speedup_vs_unreduced', 'error']


def markdown(result: dict) -> str:
    """The results as markdown: one table per workload, then the skipped rows and notes."""
    from amvim_mm.analysis.benchmark import table
    md = ['# benchmark (dense)' + (' - CPU smoke run, not a measurement' if result.get('smoke')
                                   else ''),
          '', f'`{result["command"]}`', '',
          f'environment: `{json.dumps(result.get("environment", {}))}`', '',
          f'device {result["device"]}, autocast {result["dtype"]}, wall {result.get("wall_s")}'
          f' s, budget {result.get("budget_s")} s; medians of {result["sizes"]["repeats"]} '
          'repeats, spread = (max - min) / median', '']
    for w, title in result['workloads'].items():
        rows = [r for r in result.get('rows', []) if r['workload'] == w]
        if not rows:
            continue
        extra = {k for r in rows for k in ('windows_per_forward', 'scan_backend',
                                           'conv_backend', 'path_note', 'backbone_share',
                                           'ratio_cap', 'over_unfused_no_graphs',
                                           'backbone_graphs') if k in r}
        cols = COLUMNS[:-1] + sorted(extra) + ['error']
        md += [f'## {w}: {title}', '', table(rows, cols), '']
    if result.get('skipped'):
        md += ['## skipped', '', table(result['skipped'], [
            'workload', 'model', 'impl', 'reduction', 'mode', 'res', 'batch', 'reason']), '']
    md += ['## notes', ''] + [f'- {n}' for n in result.get('notes', [])]
    return '\n'.join(md)


def stack_versions() -> Dict[str, str]:
    """Versions of mmengine, mmcv and mmseg (or why they do not import)."""
    out = {}
    for name in ('mmengine', 'mmcv', 'mmseg'):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as e:   # noqa: BLE001
            out[name] = f'absent ({type(e).__name__})'
    return out


def run_dense(*, out_dir: str, root: str, command: str, smoke: bool,
              workloads: Optional[Sequence[str]] = None, whole_sizes: Optional[str] = None,
              budget_s: Optional[str] = None, repeats: Optional[str] = None,
              warmup: Optional[str] = None, train_iters: Optional[str] = None,
              infer_iters: Optional[str] = None, infer_modes: Optional[Sequence[str]] = None,
              log: Callable[[str], None] = print) -> dict:
    """Check the options, plan and run the suite; write ``benchmark_dense.json`` and
    ``benchmark_dense.md`` to ``out_dir``; return the result."""
    cuda = torch.cuda.is_available()
    sizes, chosen, budget, modes = resolve_options(
        smoke=smoke, workloads=workloads, whole_sizes=whole_sizes, budget_s=budget_s,
        repeats=repeats, warmup=warmup, train_iters=train_iters, infer_iters=infer_iters,
        infer_modes=infer_modes, cuda=cuda)
    device = 'cpu' if smoke else 'cuda'
    cases = plan_cases(sizes, chosen, _ours_depth(sizes), infer_modes=modes)
    suite = DenseSuite(sizes=sizes, workloads=chosen, device=device, out_dir=out_dir,
                       root=root, command=command, budget_s=budget, smoke=smoke,
                       infer_modes=modes, log=log)
    return suite.run(cases)
