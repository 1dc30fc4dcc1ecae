"""FLOPs of a whole segmentor (or single-stage detector), split into its parts.

The backbone is counted by its own counter (:func:`.flops.backbone_flops`: any of its
conventions, with the reducer given); the neck and the heads are measured by mmengine's
``FlopAnalyzer`` (the count of the libraries' ``get_flops`` tools: multiply-accumulates of convs,
linear layers and matmuls, plus its handles for norms, pooling and upsampling) on the features
that the backbone gives for one image with the same reducer on. A reducer that restores the
feature map (``out_type='featmap'``) leaves the neck and the heads as they are; a head on the
kept tokens (``out_type='tokens'``) gets fewer tokens, and its count shows it.

Parts: ``backbone``, ``neck`` (None: the model has none), and the heads: an mmseg segmentor's
``decode_head`` and ``auxiliary_head`` (the sum over a list of them; None: none), a single-stage
detector's ``bbox_head``. The heads are measured on ``forward`` (mmseg's and mmdet's
``mode='tensor'``): a segmentor's final resize to the image and a detector's box decoding are
not counted. ``inference`` is the sum of the parts that inference runs: the auxiliary head is a
training-only loss and is left out of it (as mmseg's ``get_flops`` leaves it out).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from mmengine.analysis import FlopAnalyzer
from torch import nn

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import build_reducer
from .flops import backbone_flops

#: the heads whose counts a model may report, in table order
HEADS = ('decode_head', 'auxiliary_head', 'bbox_head')
#: heads that inference does not run
TRAIN_ONLY = ('auxiliary_head', )


def split_model(model: nn.Module) -> Tuple[nn.Module, Tuple[str, ...]]:
    """The model whose parts are counted (a fine-tuner's student) and its head names; a
    ConfigError for a model that is no segmentor or single-stage detector."""
    model = getattr(model, 'student', model)   # ReducerFineTuner: the student runs inference
    name = type(model).__name__
    if getattr(model, 'backbone', None) is None:
        raise ConfigError(f'{name} has no backbone; only segmentors (and single-stage '
                          'detectors) are split into backbone / neck / heads')
    if hasattr(model, 'decode_head'):
        return model, ('decode_head', 'auxiliary_head')
    if hasattr(model, 'roi_head'):
        raise ConfigError(f'{name} is a two-stage detector (its RoI head needs proposals); '
                          'only segmentors and single-stage detectors are split into '
                          'backbone / neck / heads')
    if getattr(model, 'bbox_head', None) is not None:
        return model, ('bbox_head', )
    raise ConfigError(f'{name} is no segmentor; only segmentors (and single-stage detectors) '
                      'are split into backbone / neck / heads (a backbone alone: --model, '
                      '--arch)')


def inference_shape(model: nn.Module) -> Optional[Tuple[int, int]]:
    """The (H, W) a segmentor infers at: the crop of sliding-window inference, else its data
    preprocessor's size (the training crop); None when the model does not say."""
    model, _ = split_model(model)
    cfg = getattr(model, 'test_cfg', None) or {}
    size = cfg.get('crop_size') if cfg.get('mode') == 'slide' else None
    size = size or getattr(getattr(model, 'data_preprocessor', None), 'size', None)
    return None if size is None else (int(size[0]), int(size[1]))


def _flatten(obj, tensors: list):
    """``obj`` with every tensor replaced by its index in ``tensors`` (appended there): the
    traced function takes tensors only (a TokenGrid holds ints and None)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1)
    if isinstance(obj, tuple) and hasattr(obj, '_fields'):   # a NamedTuple (TokenGrid)
        return type(obj)(*(_flatten(o, tensors) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_flatten(o, tensors) for o in obj)
    return obj


class _Slot(int):
    """A tensor's place in the flattened inputs."""


def _fill(obj, tensors):
    if isinstance(obj, _Slot):
        return tensors[obj]
    if isinstance(obj, tuple) and hasattr(obj, '_fields'):
        return type(obj)(*(_fill(o, tensors) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(o, tensors) for o in obj)
    return obj


class _OnTensors(nn.Module):
    """``module(inputs)`` as a function of the tensors of ``inputs`` (what a trace takes)."""

    def __init__(self, module: nn.Module, template) -> None:
        super().__init__()
        self.module, self.template = module, template

    def forward(self, *tensors):
        out = self.module(_fill(self.template, tensors))
        return tuple(out) if isinstance(out, list) else out


def module_flops(module: nn.Module, inputs) -> float:
    """FLOPs that mmengine's ``FlopAnalyzer`` counts for ``module(inputs)``; ``inputs`` a
    tensor, a (nested) list / tuple of them or a TokenGrid."""
    tensors = []
    template = _flatten(inputs, tensors)
    fa = FlopAnalyzer(_OnTensors(module, template), tuple(tensors))
    fa.unsupported_ops_warnings(False)
    fa.uncalled_modules_warnings(False)
    return float(fa.total())


def _heads(model, name: str):
    head = getattr(model, name, None)
    if head is None:
        return None
    return list(head) if isinstance(head, nn.ModuleList) else [head]


def model_flops(model: nn.Module, input_shape: Tuple[int, int],
                token_reduction: Optional[dict] = 'model', convention: Optional[str] = None,
                **options) -> Dict[str, object]:
    """GFLOPs of a segmentor's (or single-stage detector's) parts for one image of
    ``input_shape`` (H, W) (module docstring).

    Args:
        model: a built mmseg segmentor or mmdet single-stage detector (or a ReducerFineTuner
            of one) whose backbone is one of ours.
        token_reduction: as :func:`.flops.backbone_flops` (``'model'``: the backbone's own).
        convention: the backbone's FLOPs convention (None: its default).
        options: the backbone family's own (:func:`.flops.backbone_flops`).

    Returns:
        dict with ``parts`` (name -> GFLOPs, None for a part the model lacks), ``inference``
        (GFLOPs of the parts inference runs), ``heads`` (the head names, in order) and
        ``backbone`` (:func:`.flops.backbone_flops`'s result).
    """
    model, heads = split_model(model)
    bb = model.backbone
    if not hasattr(bb, 'flops_conventions'):
        raise ConfigError(f'{type(bb).__name__} is not one of our backbones; the backbone '
                          'part is counted by our backbones\' own counters')
    shape = tuple(int(s) for s in input_shape)
    bf = backbone_flops(bb, shape, token_reduction, 0,
                        convention or bb.default_flops_convention, **options)
    parts = {'backbone': bf['gflops'], 'neck': None}
    reducer = bb.token_reducer if token_reduction == 'model' else build_reducer(token_reduction)
    if token_reduction != 'model' and hasattr(reducer, 'set_image_keys'):
        reducer.set_image_keys(['model_flops'])   # random pruning: one named image, no warning
    own, was_training = bb.token_reducer, model.training
    x = torch.zeros(1, bb.in_channels, *shape, device=next(bb.parameters()).device)
    try:
        bb.swap_token_reducer(reducer)
        model.eval()
        with runtime.override(fused_mixer=False), torch.no_grad():
            feats = bb(x)
            if getattr(model, 'neck', None) is not None:
                parts['neck'] = module_flops(model.neck, feats) / 1e9
                feats = model.neck(feats)
            for name in heads:
                mods = _heads(model, name)
                parts[name] = None if mods is None else \
                    sum(module_flops(m, feats) for m in mods) / 1e9
    finally:
        bb.swap_token_reducer(own)
        model.train(was_training)
    inference = sum(v for k, v in parts.items() if v is not None and k not in TRAIN_ONLY)
    return dict(parts=parts, inference=inference, heads=heads, backbone=bf)
