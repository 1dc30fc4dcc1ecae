"""mmengine hooks of amvim_mm."""
from __future__ import annotations

from typing import Optional, Sequence

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import build_reducer
from amvim_mm.registry import HOOKS

PHASES = ('train', 'val', 'test')


def find_reducible_backbone(model):
    """The reducible backbone (Vim family, VMamba, PlainMamba) of a segmentor / detector /
    classifier (or the model itself)."""
    if is_model_wrapper(model):
        model = model.module
    for m in (getattr(model, 'backbone', None), model):
        if m is not None and hasattr(m, 'set_token_reduction'):
            return m
    raise ConfigError(f'{type(model).__name__} has no reducible backbone (a module with '
                      '`set_token_reduction` at `model.backbone`); token reduction needs Vim, '
                      'AMVim, LocalVim, VMamba or PlainMamba')


@HOOKS.register_module()
class TokenReductionHook(Hook):
    """Switch token reduction on for some phases without editing the model config.

    Example (in a config, or with ``--cfg-options``)::

        custom_hooks = [dict(type='TokenReductionHook',
                             reduction=dict(type='ToMe', ratio=0.17), phases=('val', 'test'))]

    Args:
        reduction: reducer config (see :mod:`amvim_mm.models.reduction`), or ``None`` to switch
            reduction off in those phases.
        phases: any of ``'train'``, ``'val'``, ``'test'``. The backbone's own setting is
            restored when the phase ends.
    """

    priority = 'NORMAL'

    def __init__(self, reduction: Optional[dict], phases: Sequence[str] = ('val', 'test')
                 ) -> None:
        if isinstance(phases, str):
            phases = (phases, )
        bad = [p for p in phases if p not in PHASES]
        if bad or not phases:
            raise ConfigError(f'TokenReductionHook: phases must be a non-empty subset of {PHASES}, '
                              f'got {tuple(phases)}')
        build_reducer(reduction)  # fail at build time on a bad config
        self.reduction = reduction
        self.phases = tuple(phases)
        self._saved = {}

    def _on(self, runner, phase: str) -> None:
        if phase in self.phases:
            backbone = find_reducible_backbone(runner.model)
            self._saved[phase] = backbone.token_reducer
            backbone.set_token_reduction(self.reduction)
            runner.logger.info(f'TokenReductionHook: {phase} with {self.reduction}')

    def _off(self, runner, phase: str) -> None:
        if phase in self._saved:
            find_reducible_backbone(runner.model).set_token_reduction(self._saved.pop(phase))

    def before_train(self, runner) -> None:
        self._on(runner, 'train')

    def after_train(self, runner) -> None:
        self._off(runner, 'train')

    def before_val(self, runner) -> None:
        self._on(runner, 'val')

    def after_val(self, runner) -> None:
        self._off(runner, 'val')

    def before_test(self, runner) -> None:
        self._on(runner, 'test')

    def after_test(self, runner) -> None:
        self._off(runner, 'test')
