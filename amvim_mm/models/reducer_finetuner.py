"""Fine-tuning a learned token reducer on a trained model: the student, the teacher, the losses.

:class:`ReducerFineTuner` wraps any mmengine model of the three libraries whose backbone
carries a learned reducer (an mmpretrain ``ImageClassifier``, an mmseg ``EncoderDecoder``, an
mmdet detector): the **student** is that model; the **teacher** is the same model without the
reducer, frozen and in eval mode, started from the same weights (DynamicViT's distillation
from the unreduced model). One training step's loss is

* the library's own loss of the student (cross-entropy, decode-head losses, ...);
* the reducer's own terms (:meth:`~amvim_mm.models.reduction.learned.LearnedReducer.
  loss_terms`: DynamicViT's keep-ratio loss);
* ``logit_weight * KL(teacher || student)`` of the classifier logits (models with a ``head``);
* ``token_weight *`` MSE between the student's and the teacher's final normed patch tokens at
  the tokens the student kept (DynamicViT's token distillation; for dense models the only
  distillation term, DyVM-style).

Weights: the config's ``load_from`` may name a checkpoint of the plain model (keys
``backbone.*``, ``head.*`` / ``decode_head.*``): it is loaded into both the student and the
teacher (the reducer's parameters start fresh); the same layout with the reducer's keys (a
fine-tuned student exported alone) loads strictly; a checkpoint of this wrapper (``student.*``,
``teacher.*``, e.g. to resume) loads as it is. ``val`` / ``test`` and ``tools/test.py`` run the
student (reducer on, inference path).
"""
from __future__ import annotations

import copy
from typing import Dict, Optional

import torch
import torch.nn as nn
from mmengine.model import BaseModel

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from .reduction.learned import patch_tokens
from .reduction.learned_losses import logit_distill_loss, token_distill_loss
from .reduction.settings import check_number

WRAPPER_PREFIXES = ('student.', 'teacher.', 'data_preprocessor.')


@MODELS.register_module()
class ReducerFineTuner(BaseModel):
    """Student with a learned reducer + frozen unreduced teacher (see the module docstring).

    Args:
        model: the model config (its backbone has ``token_reduction`` of a learned reducer).
        logit_weight: weight of the logit distillation (DynamicViT 0.5; 0: off), in [0, inf).
        token_weight: weight of the token distillation (DynamicViT 0.5; 0: off), in [0, inf).
        train_only_reducer: train the reducer's parameters only (LTMP: every other parameter
            frozen); else the whole student trains (DynamicViT; scale the backbone's learning
            rate with the optimizer's ``paramwise_cfg``).
        data_preprocessor: the runner's top-level ``data_preprocessor`` (mmpretrain configs),
            given to ``model`` unless it has its own.
    """

    def __init__(self, model: dict, logit_weight: float = 0.5, token_weight: float = 0.5,
                 train_only_reducer: bool = False, data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        logit_weight = check_number('ReducerFineTuner', 'logit_weight', logit_weight, low=0)
        token_weight = check_number('ReducerFineTuner', 'token_weight', token_weight, low=0)
        if not isinstance(model, dict) or not isinstance(model.get('backbone'), dict):
            raise ConfigError('ReducerFineTuner: model must be a model config with a backbone')
        model = copy.deepcopy(model)
        if data_preprocessor is not None:   # the runner hands a config's top-level one here
            model.setdefault('data_preprocessor', data_preprocessor)
        red = model['backbone'].get('token_reduction')
        if not isinstance(red, dict):
            raise ConfigError('ReducerFineTuner: the backbone needs token_reduction=dict(type='
                              "'DynamicViT', ...) (a learned reducer)")
        self.student = MODELS.build(copy.deepcopy(model))
        if self.backbone.token_reducer is None or not self.backbone.token_reducer.learned:
            raise ConfigError(f'ReducerFineTuner: {red.get("type")!r} is not a learned reducer '
                              '(DynamicViT); training-free reducers need no fine-tuner')
        self.data_preprocessor = self.student.data_preprocessor
        self.logit_weight, self.token_weight = logit_weight, token_weight
        self.train_only_reducer = bool(train_only_reducer)
        self.teacher = None
        if self.logit_weight or self.token_weight:
            cfg = copy.deepcopy(model)
            cfg['backbone']['token_reduction'] = None
            self.teacher = MODELS.build(cfg)
            self.teacher.requires_grad_(False)
            self.teacher.backbone.record_final_stream = True
            self.backbone.record_final_stream = True
        if self.train_only_reducer:
            for name, p in self.student.named_parameters():
                p.requires_grad_(name.startswith('backbone.token_reducer.'))
        self._register_load_state_dict_pre_hook(self._from_plain_model)

    @property
    def backbone(self) -> nn.Module:
        """The student's backbone (where the reducer lives; what the tools look for)."""
        return self.student.backbone

    def _from_plain_model(self, state_dict, prefix, *args, **kwargs) -> None:
        """A plain model's checkpoint (no ``student.`` keys) initialises the student and the
        teacher alike."""
        keys = [k for k in state_dict if k.startswith(prefix)]
        if any(k[len(prefix):].startswith(('student.', 'teacher.')) for k in keys):
            return
        for k in keys:
            rest = k[len(prefix):]
            if rest.startswith(WRAPPER_PREFIXES):
                continue
            v = state_dict.pop(k)
            state_dict[prefix + 'student.' + rest] = v
            # the teacher has no reducer: a student-only export (plain keys with the reducer's)
            # loads strictly too
            if self.teacher is not None and not rest.startswith('backbone.token_reducer.'):
                state_dict[prefix + 'teacher.' + rest] = v

    def train(self, mode: bool = True):
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        if mode == 'loss':
            return self.loss(inputs, data_samples)
        return self.student(inputs, data_samples, mode=mode)

    def loss(self, inputs, data_samples) -> Dict[str, torch.Tensor]:
        bb = self.backbone
        head = getattr(self.student, 'head', None) if self.logit_weight else None
        seen = {}
        hook = None if head is None else head.register_forward_hook(
            lambda m, a, out: seen.__setitem__('logits', out))
        try:
            losses = self.student.loss(inputs, data_samples)
        finally:
            if hook is not None:
                hook.remove()
        losses.update(bb.token_reducer.loss_terms())
        if self.teacher is None:
            return losses
        with torch.no_grad():
            t_feats = self.teacher.extract_feat(inputs)
            t_logits = self.teacher.head(t_feats) if 'logits' in seen else None
        if t_logits is not None:
            s_logits = seen['logits']
            if not isinstance(s_logits, torch.Tensor):
                raise ConfigError(f'ReducerFineTuner: {type(head).__name__} returns '
                                  f'{type(s_logits).__name__}, not logits; set logit_weight=0')
            losses['loss_distill_logits'] = self.logit_weight * logit_distill_loss(
                s_logits.float(), t_logits.float())
        if self.token_weight:
            losses['loss_distill_tokens'] = self.token_weight * self._token_loss()
        return losses

    def _token_loss(self) -> torch.Tensor:
        s_bb, t_bb = self.backbone, self.teacher.backbone
        ctx = s_bb.last_context
        s_tok = patch_tokens(self._normed(s_bb, s_bb.final_stream), ctx.cls_index)
        t_tok = patch_tokens(self._normed(t_bb, t_bb.final_stream), ctx.cls_index)
        keep = getattr(s_bb, 'keep_mask', None)
        keep = (torch.ones(s_tok.shape[:2], device=s_tok.device) if keep is None
                else patch_tokens(keep.detach().unsqueeze(-1), ctx.cls_index))
        return token_distill_loss(s_tok.float(), t_tok.float(), keep)

    @staticmethod
    def _normed(bb, stream: torch.Tensor) -> torch.Tensor:
        return bb.norm_f(stream) if getattr(bb, 'final_norm', False) else stream
