"""Config loading, model and Runner construction shared by the tools (``tools/train.py``,
``tools/test.py``, ``get_flops``, ``count_params``, ``erf``).

Which library runs is taken from the config's ``default_scope`` (``mmseg``, ``mmdet`` or
``mmpretrain``, set by the libraries' own ``default_runtime`` bases), so one set of tools serves
all three tasks.
"""
from __future__ import annotations

import os.path as osp
import re
from typing import List, Optional, Sequence, Tuple

from mmengine.config import Config

from amvim_mm.errors import ConfigError
from amvim_mm.utils.config_lookup import cached_package_lookups

SCOPES = ('mmseg', 'mmdet', 'mmpretrain')
#: the built-in toy-shapes sets of the demo configs, which ``tools/demo.py`` generates
TOY_SHAPES_ROOT = re.compile(r'(?:^|/)data/toy_shapes(?:_coco|_cls)?/*$')


def load_config(path: str, cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None, launcher: str = 'none') -> Config:
    """Load a config (with ``custom_imports``), apply overrides, set the work dir."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    with cached_package_lookups():   # mmengine re-reads the libraries' model indexes per base
        cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope not in SCOPES:
        raise ConfigError(f'{path}: default_scope is {scope!r}; amvim_mm tools run mmseg, mmdet '
                          f'and mmpretrain configs ({", ".join(SCOPES)})')
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    # crash-safe checkpoint saves (amvim_mm.engine.checkpoint_hook) for mmengine's hook
    ckpt = cfg.get('default_hooks', {}).get('checkpoint')
    if ckpt is not None and ckpt.get('type') in ('CheckpointHook', 'mmengine.CheckpointHook'):
        ckpt['type'] = 'AtomicCheckpointHook'
    return cfg


def enable_amp(cfg: Config, dtype: str = 'bfloat16') -> None:
    """Switch the optimizer wrapper to mixed precision (bf16 by default)."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError('--amp needs a CUDA device (mmengine\'s AmpOptimWrapper is GPU '
                           'only); drop --amp to train in fp32 on the CPU')
    ow = cfg.optim_wrapper
    if ow.get('type') == 'AmpOptimWrapper':
        ow.setdefault('dtype', dtype)
    else:
        ow.type = 'AmpOptimWrapper'
        ow.dtype = dtype
        ow.setdefault('loss_scale', 'dynamic')


def dataset_roots(cfg: Config, loaders: Sequence[str]) -> List[Tuple[str, str]]:
    """``(config key, data_root)`` of every dataset of the named dataloaders, through dataset
    wrappers (``dataset=`` / ``datasets=[...]``), e.g.
    ``('test_dataloader.dataset.data_root', 'data/toy_shapes')``."""
    found = []

    def walk(node, key):
        if isinstance(node, dict):
            root = node.get('data_root')
            if isinstance(root, str) and root:
                found.append((f'{key}.data_root', root))
            for child in ('dataset', 'datasets'):
                if child in node:
                    walk(node[child], f'{key}.{child}')
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, f'{key}.{i}')

    for name in loaders:
        loader = cfg.get(name)
        if isinstance(loader, dict):
            walk(loader.get('dataset'), f'{name}.dataset')
    return found


def check_data_roots(cfg: Config, loaders: Sequence[str], config: str = '') -> None:
    """A one-line error before the runner builds when a dataset's ``data_root`` of the named
    dataloaders is not a folder (relative roots are read from the working directory, as the
    libraries read them; URLs are not checked): it names the root and its config key, and for
    the demo's toy shapes the command that generates them."""
    for key, root in dataset_roots(cfg, loaders):
        if '://' in root or osp.isdir(root):
            continue
        where = f'{key} of {config}' if config else key
        if TOY_SHAPES_ROOT.search(osp.normpath(root).replace(osp.sep, '/')):
            hint = ('generate the demo data with `python tools/demo.py --data-only` in the '
                    'repository root')
        else:
            hint = f'prepare the data set there or set --cfg-options {key}=DIR'
        raise FileNotFoundError(f'data root not found: {root} ({where}); {hint}')


def train_loaders(cfg: Config) -> Tuple[str, ...]:
    """The dataloaders ``runner.train()`` reads: the training one, and the validation one when
    the config has a validation loop."""
    val = all(cfg.get(k) is not None for k in ('val_cfg', 'val_dataloader', 'val_evaluator'))
    return ('train_dataloader', 'val_dataloader') if val else ('train_dataloader', )


def make_runner(cfg: Config):
    """Build the Runner the config asks for (``runner_type``), in its default scope."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def build_model(cfg: Config, config: str = ''):
    """The config's model, built from its library's registry (the library's modules registered)
    in its ``default_scope``, without a Runner. The backbone's ``init_cfg`` is cleared (also
    under a ReducerFineTuner's ``model=``): nothing is loaded now or by a later
    ``init_weights``; load weights with :func:`load_model_weights`. A config without a model,
    or with a type no registry knows, is a one-line ConfigError naming ``config``."""
    import importlib

    from mmengine.registry import DefaultScope

    from amvim_mm.errors import first_line
    if not isinstance(cfg.get('model'), dict):
        raise ConfigError(f'{config}: no model in the config')
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    inner = cfg.model.get('model', cfg.model)   # ReducerFineTuner: model=dict(backbone=...)
    if isinstance(inner.get('backbone'), dict):
        inner.backbone.init_cfg = None
    try:
        with DefaultScope.overwrite_default_scope(scope):
            return importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model)
    except KeyError as e:   # an unknown type: the registry's message, in one line
        raise ConfigError(f'{config}: {first_line(e)}') from None


def load_model_weights(model, filename: str, strict: bool = True) -> dict:
    """Load a trained model's weights strictly (every missing/unexpected key is reported).

    Accepts our/mmengine checkpoints (``state_dict``) and, for classifiers, official Vim and
    VMamba files (converted on the fly: ``backbone.*`` and ``head.fc.*``), by local path, URL or
    prefixed name (all through the allow-list loader). Returns the file's
    ``meta`` dict (mmengine's ``epoch`` / ``iter`` ...; empty when it has none).
    """
    import torch.nn as nn
    from mmengine.model import is_model_wrapper

    from amvim_mm.utils.checkpoint import (CheckpointMismatchError, convert_official,
                                           extract_state_dict, official_family)
    from amvim_mm.utils.remote_checkpoint import load_checkpoint
    if is_model_wrapper(model):
        model = model.module
    ckpt = load_checkpoint(filename)
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    sd = extract_state_dict(ckpt)
    own = set(model.state_dict())
    ema = [k for k in sd if k.startswith('ema_') and k not in own]
    if ema:   # mmcls's EMA hook keeps buffers ema_* on the model: not this model's weights
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().info(f'{filename}: {len(ema)} EMA buffers (ema_*) '
                                             'not loaded')
        sd = {k: v for k, v in sd.items() if k not in ema}
    if official_family(sd) is not None:
        head = getattr(model, 'head', None)
        with_head = head is not None and isinstance(getattr(head, 'fc', None), nn.Linear)
        sd = convert_official(sd, with_head=with_head)
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise CheckpointMismatchError(f'{filename} does not fit {type(model).__name__}: '
                                      f'{e}') from None
    if missing or unexpected:
        msg = (f'{filename} vs {type(model).__name__}: '
               + (f'missing keys ({len(missing)}): {list(missing)[:20]}'
                  + (' ...' if len(missing) > 20 else '') + '; ' if missing else '')
               + (f'unexpected keys ({len(unexpected)}): {list(unexpected)[:20]}'
                  if unexpected else ''))
        if strict:
            raise CheckpointMismatchError(msg + '. Is this the checkpoint of this config?')
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().warning(msg)
    return meta if isinstance(meta, dict) else {}


def drop_token_reduction_hooks(cfg: Config) -> List[dict]:
    """Remove the config's ``TokenReductionHook`` entries from ``custom_hooks`` and return them.

    ``tools/test.py --reduce`` and ``prune_eval`` set the reducer on the built backbone; a
    config's hook would replace it at the start of the test phase (the ``*_tokenreduce.py``
    configs carry one), so that the printed metric would be the hook's reduction, not the asked
    one.
    """
    def is_reduction_hook(h) -> bool:
        t = h.get('type') if isinstance(h, dict) else None
        name = t if isinstance(t, str) else getattr(t, '__name__', '')
        return name.split('.')[-1] == 'TokenReductionHook'

    hooks = list(cfg.get('custom_hooks', []) or [])
    dropped = [h for h in hooks if is_reduction_hook(h)]
    if dropped:
        cfg.custom_hooks = [h for h in hooks if not is_reduction_hook(h)]
    return dropped


def identify_images(cfg: Config) -> None:
    """Add ``ImageIdentityHook`` to the config's ``custom_hooks`` (once): a reducer with a
    random choice then draws it per image, whatever the batch size (see
    :class:`~amvim_mm.engine.hooks.ImageIdentityHook`)."""
    hooks = list(cfg.get('custom_hooks', []) or [])
    if not any(isinstance(h, dict) and str(h.get('type', '')).split('.')[-1] in
               ('ImageIdentityHook', 'TokenReductionHook') for h in hooks):
        hooks.append(dict(type='ImageIdentityHook'))
    cfg.custom_hooks = hooks
