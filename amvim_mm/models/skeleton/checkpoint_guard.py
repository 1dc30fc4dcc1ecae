"""Loading rules every backbone of this project keeps: ``init_cfg=Pretrained`` is strict and
never silently empty, mmseg's ``pretrained=`` means the same, and a whole-model load cannot
leave the backbone on random weights."""
from __future__ import annotations

import warnings
from typing import Optional, Tuple, Union

from mmengine.logging import MMLogger

from amvim_mm.errors import CheckpointMismatchError, ConfigError
from amvim_mm.utils.checkpoint import load_backbone_checkpoint

PRETRAINED_KEYS = frozenset({'type', 'checkpoint', 'strict', 'prefix', 'map_location'})


def pretrained_init_cfg(name: str, pretrained: Optional[str],
                        init_cfg: Union[dict, list, None]) -> Union[dict, list, None]:
    """The ``init_cfg`` of a backbone given mmseg's deprecated ``pretrained=`` argument.

    mmseg's ``EncoderDecoder`` hands its own ``pretrained`` to the backbone (``backbone.pretrained
    = pretrained``), so a config that keeps its base's ``pretrained=...`` gives every backbone
    that argument. As mmseg's backbones (``ResNet``, ``VisionTransformer``): a path becomes
    ``init_cfg=dict(type='Pretrained', checkpoint=path)`` (loaded strictly by
    :meth:`CheckpointGuard.load_pretrained`) with mmseg's deprecation warning, ``None`` leaves
    ``init_cfg`` as it is; both at once, or anything but a non-empty path, is a
    :class:`~amvim_mm.errors.ConfigError`.
    """
    if pretrained is None:
        return init_cfg
    if init_cfg is not None:
        raise ConfigError(f'{name}: init_cfg and pretrained cannot be set at the same time (got '
                          f'pretrained={pretrained!r}); keep init_cfg=dict(type=\'Pretrained\', '
                          'checkpoint=...) or set pretrained=None')
    if not isinstance(pretrained, str) or not pretrained.strip():
        raise ConfigError(f'{name}: pretrained must be a checkpoint path (str) or None, got '
                          f'{pretrained!r}')
    warnings.warn('DeprecationWarning: pretrained is deprecated, please use "init_cfg" instead')
    return dict(type='Pretrained', checkpoint=pretrained)


class CheckpointGuard:
    """Mixin of a backbone (an ``nn.Module`` with ``init_cfg`` and ``out_type``).

    Subclasses set :attr:`classifier_out_types` (the ``out_type`` values that feed a
    classifier head) and call :meth:`guard_whole_model_loads` in ``__init__``.
    """

    #: ``out_type`` values of a classification backbone (its checkpoint may carry ``head.fc``)
    classifier_out_types: Tuple[str, ...] = ('cls_token', )

    def load_pretrained(self) -> bool:
        """Load ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` strictly (see
        :func:`~amvim_mm.utils.checkpoint.load_backbone_checkpoint`); False when the init_cfg
        is something else. A missing, empty or blank ``checkpoint`` is a
        :class:`~amvim_mm.errors.ConfigError`, never a silent random start."""
        cfg = self.init_cfg
        if not (isinstance(cfg, dict) and cfg.get('type') == 'Pretrained'):
            return False
        name = type(self).__name__
        unknown = set(cfg) - PRETRAINED_KEYS
        if unknown:
            raise ConfigError(f'{name}: init_cfg of type Pretrained does not take '
                              f'{sorted(unknown)}')
        ckpt = cfg.get('checkpoint')
        if not isinstance(ckpt, str) or not ckpt.strip():
            raise ConfigError(f'{name}: init_cfg of type Pretrained needs "checkpoint" (a file '
                              f'path), got {ckpt!r}; use init_cfg=None to train from scratch')
        load_backbone_checkpoint(self, ckpt, strict=cfg.get('strict', True),
                                 prefix=cfg.get('prefix'))
        self._is_init = True
        return True

    def keep_missing_output_norms(self, state_dict, prefix: str, norm_prefix: str,
                                  anchor: str) -> None:
        """For a load pre-hook: output norms this port adds on top of the official model
        (parameters named ``norm_prefix*``) that a file with this backbone's weights (``anchor``
        present) lacks altogether keep this model's values (weight 1, bias 0 after
        initialisation, as the official dense backbones start them); logged by name."""
        own = [n for n, _ in self.named_parameters() if n.startswith(norm_prefix)]
        if own and prefix + anchor in state_dict and \
                not any(prefix + n in state_dict for n in own):
            for n in own:
                state_dict[prefix + n] = self.get_parameter(n).detach().clone()
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}: the checkpoint has no output norms; '
                f'{sorted({n.rsplit(".", 1)[0] for n in own})} keep their initial values '
                '(weight 1, bias 0)')

    def guard_whole_model_loads(self) -> None:
        self._register_load_state_dict_pre_hook(self._record_load)
        self.register_load_state_dict_post_hook(self._check_loaded)

    def _record_load(self, state_dict, prefix, *args, **kwargs) -> None:
        """Remember where this backbone sits in a whole-model load and whether the checkpoint
        has any of its weights (checked by :meth:`_check_loaded`)."""
        self._load_prefix = prefix
        self._load_found = any(k.startswith(prefix) for k in state_dict)
        self._check_dtypes(state_dict, prefix)

    def _check_dtypes(self, state_dict, prefix: str) -> None:
        """Refuse a checkpoint tensor that is not floating point where the backbone's is:
        ``load_state_dict`` would cast an int64 or bool tensor into the float weight without a
        word (a tampered or wrong file loading as weights)."""
        import torch
        own = dict(self.named_parameters())
        own.update(dict(self.named_buffers()))
        for name, mine in own.items():
            theirs = state_dict.get(prefix + name)
            if isinstance(theirs, torch.Tensor) and mine.is_floating_point() and \
                    not (theirs.is_floating_point() or theirs.is_complex()):
                raise CheckpointMismatchError(
                    f'{type(self).__name__}: the checkpoint\'s {prefix + name} is {theirs.dtype}, '
                    f'the model\'s is {mine.dtype}: not a weight of this model')

    def _check_loaded(self, module, incompatible) -> None:
        """Refuse a whole-model load that would leave this backbone on random weights.

        mmengine's ``load_from`` (the libraries' own ``tools/test.py``) loads with
        ``strict=False`` and only logs missing keys. Two cases are errors here:

        - the checkpoint holds no weight of the backbone at all (e.g. a file of another model);
        - a dense model (an ``out_type`` not in :attr:`classifier_out_types`) is given a
          classifier's checkpoint (``backbone.*`` with ``head.fc.*``; official ImageNet files
          arrive in this layout, see :mod:`amvim_mm.utils.compat`): its heads would stay
          random.
        """
        prefix = getattr(self, '_load_prefix', '')
        if not prefix:   # the backbone itself is loaded: load_state_dict's strict decides
            return
        parent = prefix[:-len('backbone.')] if prefix.endswith('backbone.') else None
        if not self._load_found:
            raise CheckpointMismatchError(
                f'the checkpoint has no weights for the {type(self).__name__} backbone (no key '
                f'starts with {prefix!r}); is it a checkpoint of this model? Backbone weights '
                "alone load with init_cfg=dict(type='Pretrained', checkpoint=...)")
        if parent is not None and self.out_type not in self.classifier_out_types and \
                parent + 'head.fc.weight' in incompatible.unexpected_keys:
            raise CheckpointMismatchError(
                'the checkpoint is a classifier\'s (backbone + head.fc, e.g. an official '
                'ImageNet file); this dense model\'s heads would stay random. Give it to the '
                "backbone (init_cfg=dict(type='Pretrained', checkpoint=...)) and train, or test "
                'a checkpoint of this model')
