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
  backbone's ``cuda_graph=True`` (:mod:`amvim_mm.models.skeleton.graphs`): the pipeline stays
  eager, the backbone's forward is replayed from a CUDA graph (captured in the warm-up).
  ``auto-graphs`` is the default path (graphs are on by default for CUDA inference); the other
  impls set ``cuda_graph=False``, so ``auto`` is the plain eager forward. Their
  ``fused_over_unfused`` divides one by the other (both graphed); ``over_unfused_no_graphs``
  divides ``auto-graphs`` by the plain eager ``unfused`` row: what a user of the official
  code's speed gains by switching both on;
* ``peer``: mmseg's ``VisionTransformer`` at DeiT-T size (embed 192, depth 12, heads 3, patch
  16) with the same neck and heads, no token reduction.

Which path actually ran is recorded per row (``path_ran``, ``fused_calls``): one warm-up call
runs under :class:`PathProbe`, which asks every mixer call for its decision
(:meth:`~amvim_mm.models.vim.mixer.BiMambaMixer.use_fused` and the per-call conditions its
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
  ratio a backbone that took no time would give. A reduced whole or slide row reports its
  speed-up three ways: ``backbone_speedup`` (the ade-backbone rows of the same reduction and
  size), ``speedup_vs_unreduced`` (the whole model) and ``ceiling_speedup`` (the unreduced whole
  time with its backbone's share scaled by the FLOPs ratio:
  :func:`amvim_mm.bench.measure.speedup_ceiling`);
* ``coco``: the Vim-T Mask R-CNN config's backbone and simple feature pyramid only (no mmdet),
  1024 x 1024, batch 2, forward + backward of the sum of the level means (no optimizer step);
* ``in1k``: the AMVim-T ImageNet fine-tuning recipe (backbone + linear head, label smoothing
  0.1, AdamW lr 4e-5 wd 0.05 through the layer-decay constructor), 224, batch 128; Vim-T is run
  with the same recipe (only the backbone type differs).

Models (``--models``): ``vim``, ``amvim`` (the UperNets above), ``peer``, and
``vim-segmenter``: ``configs/vim/vim-t_segmenter-mask_8xb1-160k_ade20k-512x512.py``, Vim-T
handing its kept tokens (``out_type='tokens'``) to Segmenter's mask transformer, whose per-token
class scores are restored to the grid (issue 54; ADE20K inference workloads only). Its
ade-backbone rows time the backbone up to its token output.

Precision: every row under bf16 autocast by default; ``--dense-dtype fp32`` runs them without
autocast, as mmseg's / mmdet's test tools run our configs (they set no AMP).

Token reduction: ToMe at ratios 0.17 and 0.46 for the inference rows by default
(``--methods`` / ``--ratios``: any of prune_eval's training-free methods at any ratios, mapped to
reducers as prune_eval does), ToP (ToP-ViM's Tiny
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

from typing import Callable, Optional, Sequence

import torch

from amvim_mm.errors import ConfigError

from .config import (ADE_CONFIGS, ADE_INFER_ONLY, METHODS, MODELS, COCO_BACKBONE, COCO_NECK, FULL, GRAPH_IMPLS, IMPLS,
                     IN1K_BACKBONE, IN1K_HEAD, IN1K_OPTIM, INFER_MODES, PEER_NOTE, SMOKE,
                     TOME_RATIOS, TOP_KEEP_RATE, TRAINING, WORKLOADS, DenseSizes,
                     parse_whole_sizes, resolve_models, resolve_options)
from .models import (BackboneNeck, ClsTokenClassifier, ade_config, build_ade, build_coco,
                     build_in1k, ours_depth, ours_width, quarter_indices)
from .plan import Case, model_name, plan_cases
from .probe import PathProbe, set_fused_mixer
from .report import COLUMNS, add_ratios, markdown, stack_versions
from .suite import DenseSuite
from .timing import prepare_step, summarize, tensor_bytes

__all__ = [
    'ADE_CONFIGS', 'ADE_INFER_ONLY', 'METHODS', 'MODELS', 'COCO_BACKBONE', 'COCO_NECK', 'FULL', 'GRAPH_IMPLS', 'IMPLS', 'IN1K_BACKBONE',
    'IN1K_HEAD', 'IN1K_OPTIM', 'INFER_MODES', 'PEER_NOTE', 'SMOKE', 'TOME_RATIOS',
    'TOP_KEEP_RATE', 'TRAINING', 'WORKLOADS', 'DenseSizes', 'parse_whole_sizes',
    'resolve_options', 'resolve_models', 'BackboneNeck', 'ClsTokenClassifier', 'ade_config', 'build_ade',
    'build_coco', 'build_in1k', 'ours_depth', 'ours_width', 'quarter_indices', 'Case',
    'model_name', 'plan_cases', 'PathProbe', 'set_fused_mixer', 'COLUMNS', 'add_ratios',
    'markdown', 'stack_versions', 'DenseSuite', 'tensor_bytes', 'prepare_step', 'summarize',
    'run_dense']


def run_dense(*, out_dir: str, root: str, command: str, smoke: bool,
              workloads: Optional[Sequence[str]] = None, whole_sizes: Optional[str] = None,
              budget_s: Optional[str] = None, repeats: Optional[str] = None,
              warmup: Optional[str] = None, train_iters: Optional[str] = None,
              infer_iters: Optional[str] = None, infer_modes: Optional[Sequence[str]] = None,
              impls: Optional[Sequence[str]] = None, dense_dtype: Optional[str] = None,
              models: Optional[Sequence[str]] = None, methods: Optional[Sequence[str]] = None,
              ratios: Optional[Sequence[str]] = None,
              log: Callable[[str], None] = print) -> dict:
    """Check the options, plan and run the suite; write ``benchmark_dense.json`` and
    ``benchmark_dense.md`` to ``out_dir``; return the result. ``impls``: only these rows'
    implementations (``peer`` for mmseg's ViT; default: every one); ``dense_dtype``: 'bf16'
    (autocast, default) or 'fp32' (none: mmseg's test tool on our configs); ``models``,
    ``methods``, ``ratios``: :func:`~.config.resolve_models`."""
    if dense_dtype not in (None, 'bf16', 'fp32'):
        raise ConfigError(f"dense dtype must be 'bf16' or 'fp32', got {dense_dtype!r}")
    cuda = torch.cuda.is_available()
    sizes, chosen, budget, modes = resolve_options(
        smoke=smoke, workloads=workloads, whole_sizes=whole_sizes, budget_s=budget_s,
        repeats=repeats, warmup=warmup, train_iters=train_iters, infer_iters=infer_iters,
        infer_modes=infer_modes, cuda=cuda)
    chosen_models, reductions = resolve_models(models, methods, ratios)
    device = 'cpu' if smoke else 'cuda'
    cases = plan_cases(sizes, chosen, ours_depth(sizes), infer_modes=modes,
                       models=chosen_models, reductions=reductions)
    if impls is not None:
        known = set(IMPLS) | set(GRAPH_IMPLS) | {'peer'}
        bad = [i for i in impls if i not in known]
        if bad:
            raise ConfigError(f'unknown dense impl {bad[0]!r}; choose from '
                              f'{", ".join(sorted(known))}')
        cases = [c for c in cases if c.impl in impls]
    suite = DenseSuite(sizes=sizes, workloads=chosen, device=device, out_dir=out_dir,
                       root=root, command=command, budget_s=budget, smoke=smoke,
                       infer_modes=modes, log=log, dtype=dense_dtype or 'bf16')
    return suite.run(cases)
