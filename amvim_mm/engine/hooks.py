"""mmengine hooks of amvim_mm."""
from __future__ import annotations

import os.path as osp
from typing import List, Optional, Sequence

import torch
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


def image_keys(data_batch) -> Optional[List[str]]:
    """The identities of a test / validation batch's images (their file names; COCO's
    ``img_id`` or the data set index where a sample has no file), or None when the batch does
    not say (e.g. test-time augmentation's nested batches)."""
    samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
    if not isinstance(samples, (list, tuple)) or not samples:
        return None
    keys = []
    for sample in samples:
        meta = getattr(sample, 'metainfo', None)
        if not isinstance(meta, dict):
            return None
        if meta.get('img_path'):
            keys.append(osp.basename(str(meta['img_path'])))
        elif meta.get('img_id') is not None:
            keys.append(f'img_id:{meta["img_id"]}')
        elif meta.get('sample_idx') is not None:
            keys.append(f'sample_idx:{meta["sample_idx"]}')
        else:
            return None
    return keys


@HOOKS.register_module()
class ImageIdentityHook(Hook):
    """Tell the backbone's token reducer which images each validation / test batch holds.

    A reducer with a random choice (:class:`~amvim_mm.models.reduction.reducers.RandomPrune`)
    draws it per image from ``(seed, image, block)``, so the result of an image does not depend
    on the batch size, the order or the position; it learns the images' identities from this
    hook (:func:`image_keys`) before every batch and forgets them after it. ``TokenReductionHook``
    does the same; ``tools/test.py`` and ``tools/prune_eval.py`` add this hook themselves. A
    config that puts ``RandomPrune`` on the backbone and runs with the libraries' own tools
    should add it::

        custom_hooks = [dict(type='ImageIdentityHook')]
    """

    priority = 'NORMAL'

    @staticmethod
    def _announce(runner, keys) -> None:
        try:
            reducer = find_reducible_backbone(runner.model).token_reducer
        except ConfigError:      # a model without a reducible backbone: nothing to tell
            return
        if hasattr(reducer, 'set_image_keys'):
            reducer.set_image_keys(keys)

    def before_val_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._announce(runner, image_keys(data_batch))

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._announce(runner, None)

    def before_test_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._announce(runner, image_keys(data_batch))

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._announce(runner, None)


@HOOKS.register_module()
class TokenReductionHook(ImageIdentityHook):
    """Switch token reduction on for some phases without editing the model config.

    Example (in a config, or with ``--cfg-options``)::

        custom_hooks = [dict(type='TokenReductionHook',
                             reduction=dict(type='ToMe', ratio=0.17), phases=('val', 'test'))]

    Args:
        reduction: reducer config (see :mod:`amvim_mm.models.reduction`), or ``None`` to switch
            reduction off in those phases.
        phases: any of ``'train'``, ``'val'``, ``'test'``. The backbone's own setting is
            restored when the phase ends.

    Like :class:`ImageIdentityHook` it tells the reducer the images of every validation and
    test batch (random pruning draws per image).
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


@HOOKS.register_module()
class FrozenWarmupHook(Hook):
    """Hold some parameters fixed for the first iterations or epochs of training.

    DynamicViT trains its predictors alone for the first epochs (learning rate 0 for the
    backbone, ``fix_step=5``). A learning rate of 0 cannot be set per group without breaking
    chained schedulers, so this hook restores the held parameters after every optimizer step of
    the warm-up instead: the same result as learning rate 0 (AdamW's decoupled decay included;
    the optimizer's moments run on, as they do with learning rate 0), under DDP too.

    Args:
        module: dotted path of the held module inside the model (default the student backbone
            of :class:`~amvim_mm.models.reducer_finetuner.ReducerFineTuner`).
        exclude: names (substrings of parameter names) that keep training, default the
            learned reducer.
        iters / epochs: the length of the warm-up (exactly one of them).
    """

    priority = 'LOW'   # after the optimizer step of the iteration

    def __init__(self, module: str = 'student.backbone',
                 exclude: Sequence[str] = ('token_reducer', ), iters: Optional[int] = None,
                 epochs: Optional[int] = None) -> None:
        if (iters is None) == (epochs is None):
            raise ConfigError('FrozenWarmupHook: give exactly one of iters or epochs')
        n = iters if iters is not None else epochs
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f'FrozenWarmupHook: iters/epochs must be an int >= 0, got {n!r}')
        self.module, self.exclude = module, tuple(exclude)
        self.iters, self.epochs = iters, epochs
        self._held = None

    def _in_warmup(self, runner) -> bool:
        if self.iters is not None:
            return runner.iter < self.iters
        return runner.epoch < self.epochs

    def _params(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        try:
            mod = model.get_submodule(self.module) if self.module else model
        except AttributeError:
            raise ConfigError(f'FrozenWarmupHook: the model has no module {self.module!r}') \
                from None
        return [p for n, p in mod.named_parameters()
                if p.requires_grad and not any(e in n for e in self.exclude)]

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self._in_warmup(runner):
            self._held = None
        elif self._held is None:
            params = self._params(runner)
            self._held = (params, [p.detach().clone() for p in params])

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        # runner.iter / runner.epoch are still this iteration's here
        if self._held is None or not self._in_warmup(runner):
            return
        with torch.no_grad():
            for p, v in zip(*self._held):
                p.copy_(v)
