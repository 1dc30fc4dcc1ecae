"""What the deployment tools (``tools/deploy/``) export: a whole segmentor, detector or
classifier of a model config, with its checkpoint and an optional token reduction, as one module
whose ``forward(images)`` returns tensors.

* segmentation (mmseg): ``encode_decode`` with fixed image metas: the logits of every class at
  the input size, ``(B, num_classes, H, W)`` (the image size is fixed at export);
* detection (mmdet): the ``mode='tensor'`` forward: the head's raw per-level outputs (class
  scores, box deltas); box decoding and NMS run after ONNX Runtime in mmdet's own
  ``predict_by_feat``;
* classification (mmpretrain): the ``mode='tensor'`` forward: the head's logits.

Deploy configs (``configs/deploy/``) use mmdeploy's format: ``onnx_config``, ``codebase_config``
and ``backend_config`` (``docs/deploy.md``).
"""
from __future__ import annotations

import importlib
import os.path as osp
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from amvim_mm.deploy.pooling import make_pools_exportable
from amvim_mm.errors import ConfigError

#: the config's default_scope -> (mmdeploy codebase task, the name of its first output)
TASKS = {'mmseg': ('Segmentation', 'seg_logits'), 'mmdet': ('ObjectDetection', 'output'),
         'mmpretrain': ('Classification', 'cls_score')}
REDUCE_CHOICES = ('tome', 'random', 'evit', 'top', 'learned')


class TaskForward(nn.Module):
    """``forward(images)`` of a built task model as a flat tuple of tensors (see the module
    docstring); ``shape`` (H, W) fixes a segmentor's output size."""

    def __init__(self, model: nn.Module, scope: str, shape: Tuple[int, int]):
        super().__init__()
        make_pools_exportable(model)
        self.model = model
        self.scope = scope
        self.shape = tuple(int(s) for s in shape)

    def forward(self, images: torch.Tensor):
        from amvim_mm.deploy.ort import flatten_outputs
        if self.scope == 'mmseg':
            h, w = self.shape
            meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                        padding_size=[0, 0, 0, 0])
            return self.model.encode_decode(images, [meta])
        return tuple(flatten_outputs(self.model(images, mode='tensor')))


def add_model_args(parser) -> None:
    """CONFIG CHECKPOINT and the reduction options of ``tools/test.py`` (same names, same
    meaning: ``amvim_mm.apis.sweep.methods``)."""
    parser.add_argument('config', help='model config (mmseg / mmdet / mmpretrain)')
    parser.add_argument('checkpoint', help='its trained weights (loaded strictly)')
    parser.add_argument('--reduce', choices=REDUCE_CHOICES,
                        help='token reduction method (those of tools/test.py --reduce)')
    parser.add_argument('--ratio', type=float, default=None,
                        help='reduction ratio in [0, 1) (0: none); not with learned')
    parser.add_argument('--seed', type=int, default=None,
                        help='--reduce random: the seed of the draws (default 0)')
    parser.add_argument('--locations', nargs='+', type=int, default=None, metavar='BLOCK',
                        help='--reduce evit/top: the blocks after which they prune')
    parser.add_argument('--cfg-options', nargs='+', default=None, metavar='KEY=VALUE',
                        help='overrides of the model config')


def _cfg_options(pairs: Optional[Sequence[str]]) -> Optional[dict]:
    if not pairs:
        return None
    from mmengine.config import DictAction
    out = {}
    for pair in pairs:
        if '=' not in pair:
            raise ConfigError(f'--cfg-options takes KEY=VALUE, got {pair!r}')
        key, value = pair.split('=', 1)
        out[key] = DictAction._parse_iterable(value)
    return out


def load_task_model(args):
    """(config, model in eval mode with its weights and the asked reduction) from the parsed
    :func:`add_model_args` options; one-line errors for bad input."""
    from amvim_mm.apis.runner import load_config, load_model_weights
    from amvim_mm.apis.sweep.methods import (LEARNED, cell_reducer, check_reduction_args,
                                             config_has_learned_reducer, learned_reducer)
    from amvim_mm.engine.hooks import find_reducible_backbone
    check_reduction_args(args.reduce, args.ratio, args.seed, args.locations)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg = load_config(args.config, _cfg_options(args.cfg_options))
    if args.reduce == LEARNED and not config_has_learned_reducer(cfg):
        raise ConfigError(f'--reduce learned needs a config whose backbone carries a learned '
                          f'reducer; {args.config} has none')
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    registry = importlib.import_module(f'{cfg.default_scope}.registry').MODELS
    model_cfg = cfg.model.copy()
    if cfg.get('data_preprocessor') is not None:   # mmpretrain's top-level key, as the Runner
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    model = registry.build(model_cfg)
    load_model_weights(model, args.checkpoint, strict=True)
    from amvim_mm.models.reducer_finetuner import ReducerFineTuner
    if isinstance(model, ReducerFineTuner):   # a fine-tuning config: deploy its student
        model = model.student
    if args.reduce:
        backbone = find_reducible_backbone(model)
        backbone.set_token_reduction(
            cell_reducer(backbone, args.reduce, args.ratio, args.locations, args.seed or 0,
                         learned=learned_reducer(backbone)))
    return cfg, model.eval()


def export_shape(cfg, deploy_cfg=None, shape: Optional[Sequence[int]] = None
                 ) -> Tuple[int, int]:
    """The (H, W) the model is exported at: ``--shape``, else the deploy config's
    ``onnx_config.input_shape`` (mmdeploy's ``[W, H]``), else the model config's ``crop_size``,
    else its backbone's ``img_size``."""
    if shape:
        if len(shape) != 2 or min(shape) < 1:
            raise ConfigError(f'--shape takes H W (two positive integers), got {list(shape)}')
        return int(shape[0]), int(shape[1])
    onnx_cfg = (deploy_cfg or {}).get('onnx_config', {}) or {}
    if onnx_cfg.get('input_shape'):
        w, h = onnx_cfg['input_shape']
        return int(h), int(w)
    if cfg.get('crop_size'):
        h, w = cfg.crop_size
        return int(h), int(w)
    size = cfg.model.get('backbone', {}).get('img_size')
    if size is None:
        raise ConfigError('no image size in the deploy or model config: give --shape H W')
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def output_names(forward: TaskForward, images: torch.Tensor,
                 names: Optional[Sequence[str]] = None) -> List[str]:
    """Names of the flattened outputs: one per tensor; for a detector's per-level lists
    ``<name>_<level>`` with ``names`` naming the groups (e.g. ``cls_score``, ``bbox_pred``)."""
    from amvim_mm.deploy.ort import flatten_outputs
    default = TASKS[forward.scope][1]
    with torch.no_grad():
        raw = (forward(images) if forward.scope == 'mmseg'
               else forward.model(images, mode='tensor'))
    groups = [raw] if hasattr(raw, 'detach') else list(raw.values() if isinstance(raw, dict)
                                                         else raw)
    names = list(names or [])
    if len(names) != len(groups):
        names = [default] if len(groups) == 1 else [f'{default}{i}' for i in range(len(groups))]
    out = []
    for name, group in zip(names, groups):
        n = len(flatten_outputs(group))
        out += [name] if hasattr(group, 'detach') else [f'{name}_{i}' for i in range(n)]
    return out


def load_deploy_config(path: Optional[str]) -> dict:
    """A deploy config in mmdeploy's format (``onnx_config``, ``codebase_config``,
    ``backend_config``); only the onnxruntime backend is supported."""
    if path is None:
        return {}
    if not osp.isfile(path):
        raise FileNotFoundError(f'deploy config not found: {path}')
    from mmengine.config import Config
    cfg = Config.fromfile(path).to_dict()
    backend = (cfg.get('backend_config') or {}).get('type')
    if backend != 'onnxruntime':
        raise ConfigError(f'{path}: backend_config type {backend!r}; the tools export for '
                          f"'onnxruntime' only")
    onnx_cfg = cfg.get('onnx_config') or {}
    if onnx_cfg.get('type', 'onnx') != 'onnx':
        raise ConfigError(f"{path}: onnx_config type {onnx_cfg.get('type')!r}, expected 'onnx'")
    return cfg


def check_task(cfg, deploy_cfg: dict, path: str) -> None:
    """A deploy config for one codebase does not export a model of another."""
    codebase = (deploy_cfg.get('codebase_config') or {}).get('type')
    if codebase and codebase != cfg.default_scope:
        raise ConfigError(f'{path} is a {codebase} deploy config; the model config is '
                          f'{cfg.default_scope}')


def is_dynamic_batch(deploy_cfg: dict) -> bool:
    """Whether the deploy config's ``dynamic_axes`` make the batch size dynamic (the default
    without a deploy config); dynamic image sizes are not supported (fixed at export)."""
    onnx_cfg = deploy_cfg.get('onnx_config') if deploy_cfg else None
    if not onnx_cfg:
        return True
    axes = onnx_cfg.get('dynamic_axes') or {}
    inputs = onnx_cfg.get('input_names') or ['input']
    spec = axes.get(inputs[0], {})
    dims = set(spec) if isinstance(spec, dict) else set(spec)
    if dims - {0}:
        raise ConfigError(f'dynamic_axes {sorted(dims)} of {inputs[0]!r}: only the batch axis '
                          f'(0) can be dynamic; the image size is fixed at export')
    return 0 in dims
