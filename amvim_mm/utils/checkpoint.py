"""Checkpoints of our backbones: official files, conversion and strict loading.

Official Vim files are DeiT-style dicts with the weights under ``"model"`` (plus ``"args"``, an
``argparse.Namespace``) and keys equal to our parameter names (``layers.{i}.mixer.A_b_log``...).
Official VMamba files hold ``"model"`` (plus ``"model_ema"``, optimizer state and a yacs
``"config"``) with the keys of the official classification ``VSSM`` (``layers.{i}.blocks.{j}.op
.A_logs``..., ``classifier.norm/head``), equal to our ``VMamba``'s parameter names.
Our files (written by mmengine or by ``tools/model_converters/vim2amvim_mm.py``) hold
``"state_dict"`` with mmpretrain-style keys: ``backbone.*`` and ``head.fc.*``.
Official Vim segmentation files (hustvl/Vim ``seg/``, mmseg 0.x) hold ``"state_dict"`` with the
UperNet's keys and the pyramid inside the backbone (``backbone.fpn1.{0,1,3}.*``,
``backbone.fpn2.0.*``), a position embedding without the class-token entry and no
``cls_token``: :func:`convert_vim_seg_official` maps them to ours (``neck.ops.*``).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger

from amvim_mm.errors import CheckpointMismatchError, ConfigError
from amvim_mm.token_layout import cls_slot
from .remote_checkpoint import load_checkpoint

OFFICIAL_HEAD_KEYS = ('head.weight', 'head.bias')
# Keys some official/derived files carry that are buffers of other code, not weights.
IGNORED_KEYS = ('rope.freqs_cos', 'rope.freqs_sin')


#: official Vim segmentation key prefixes (pyramid inside the backbone) -> ours (PlainPyramidNeck)
VIM_SEG_KEY_MAP = (('backbone.fpn1.', 'neck.ops.0.'), ('backbone.fpn2.0.', 'neck.ops.1.'))


__all__ = ['CheckpointMismatchError', 'as_model_checkpoint', 'backbone_state_dict',
           'convert_official', 'convert_vim_official', 'convert_vim_seg_official',
           'convert_vmamba_official', 'is_official_vim_seg',
           'extract_state_dict', 'is_official_vim', 'is_official_vmamba', 'official_family',
           'load_backbone_checkpoint']
VMAMBA_HEAD_KEYS = {'classifier.head.weight': 'head.fc.weight',
                    'classifier.head.bias': 'head.fc.bias',
                    'head.weight': 'head.fc.weight', 'head.bias': 'head.fc.bias'}   # old names


def extract_state_dict(checkpoint: Mapping) -> Dict[str, torch.Tensor]:
    """The weights of a loaded checkpoint: under ``state_dict``, ``model`` or the dict itself."""
    if not isinstance(checkpoint, Mapping):
        raise ConfigError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    for key in ('state_dict', 'model', 'module'):
        if key in checkpoint and isinstance(checkpoint[key], Mapping):
            sd = checkpoint[key]
            break
    else:
        sd = checkpoint
    out = OrderedDict()
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise ConfigError(f'checkpoint entry {k!r} is a {type(v).__name__}, not a tensor; '
                              'is this a weights file?')
        if k.startswith('module.'):  # DistributedDataParallel wrapper
            k = k[len('module.'):]
        out[k] = v
    return out


def is_official_vim(sd: Mapping[str, torch.Tensor]) -> bool:
    return 'patch_embed.proj.weight' in sd and any(k.startswith('layers.') for k in sd)


def is_official_vmamba(sd: Mapping[str, torch.Tensor]) -> bool:
    """An official VMamba classification state dict (current or old key names)."""
    return any(k.startswith('patch_embed.') for k in sd) and \
        any(k.startswith('layers.') and k.endswith('.A_logs') for k in sd)


def official_family(sd: Mapping[str, torch.Tensor]) -> Optional[str]:
    """``'vmamba'`` or ``'vim'`` for an official file's weights (without ``backbone.``), else
    None."""
    if any(k.startswith('backbone.') for k in sd):
        return None
    if is_official_vmamba(sd):
        return 'vmamba'
    return 'vim' if is_official_vim(sd) else None


def is_official_vim_seg(sd: Mapping[str, torch.Tensor]) -> bool:
    """An official Vim segmentation state dict: the pyramid inside the backbone."""
    return 'backbone.fpn1.0.weight' in sd and any(k.startswith('backbone.layers.') for k in sd)


def convert_vim_seg_official(sd: Mapping[str, torch.Tensor],
                             with_head: bool = True) -> 'OrderedDict[str, torch.Tensor]':
    """Official Vim segmentation weights -> our UperNet config's state dict (pure function).

    ``backbone.fpn1.*`` -> ``neck.ops.0.*`` and ``backbone.fpn2.0.*`` -> ``neck.ops.1.*`` (the
    same transposed convs and norm, :class:`~amvim_mm.models.necks.PlainPyramidNeck`); the
    position embedding (patches only) gets a zero entry at the middle class-token slot and an
    unused zero ``cls_token`` is added (both unused with ``with_cls_token=False``, so our
    strict load sees every key); ``decode_head.*`` / ``auxiliary_head.*`` unchanged
    (``with_head=False``: backbone and neck only). A file trained with RoPE (``rope.*``
    buffers: the official Vim-S and detection settings) is refused: our Vim has no RoPE, and
    its features would silently differ.
    """
    if not is_official_vim_seg(sd):
        raise ConfigError('not an official Vim segmentation state dict: expected keys '
                          'backbone.fpn1.0.weight and backbone.layers.*')
    rope = sorted(k for k in sd if k.startswith('backbone.rope.'))
    if rope:
        raise ConfigError(f'this official Vim segmentation file was trained with RoPE ({rope[0]}'
                          '...), which amvim_mm\'s Vim does not implement: it cannot be loaded')
    out = OrderedDict()
    for k, v in sd.items():
        for old, new in VIM_SEG_KEY_MAP:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        if with_head or k.startswith(('backbone.', 'neck.')):
            out[k] = v
    pe = out.get('backbone.pos_embed')
    if pe is not None and 'backbone.cls_token' not in out:
        if pe.dim() != 3:
            raise ConfigError(f'backbone.pos_embed has shape {tuple(pe.shape)}, expected '
                              '(1, patches, D)')
        mid = cls_slot(pe.shape[1])
        slot = pe.new_zeros(pe.shape[0], 1, pe.shape[2])
        out['backbone.pos_embed'] = torch.cat([pe[:, :mid], slot, pe[:, mid:]], dim=1)
        out['backbone.cls_token'] = pe.new_zeros(1, 1, pe.shape[2])
    return out


def convert_vmamba_official(sd: Mapping[str, torch.Tensor],
                            with_head: bool = True) -> 'OrderedDict[str, torch.Tensor]':
    """Official VMamba weights -> an mmpretrain ``ImageClassifier`` state dict (pure function).

    ``backbone.<key>`` for every other weight (old names are mapped by the backbone's load
    hook; ``classifier.norm`` is the classifier input norm of ``out_type='avg_featmap'``);
    ``classifier.head.*`` -> ``head.fc.*`` (``LinearClsHead``) when ``with_head``.
    """
    if not is_official_vmamba(sd):
        raise ConfigError('not an official VMamba state dict: expected keys patch_embed.* and '
                          'layers.*.A_logs')
    out = OrderedDict()
    for k, v in sd.items():
        if k in VMAMBA_HEAD_KEYS:
            if with_head:
                out[VMAMBA_HEAD_KEYS[k]] = v
            continue
        out['backbone.' + k] = v
    return out


def convert_official(sd: Mapping[str, torch.Tensor],
                     with_head: bool = True) -> 'OrderedDict[str, torch.Tensor]':
    """An official Vim or VMamba file's weights -> an mmpretrain ``ImageClassifier`` state
    dict (:func:`convert_vim_official` / :func:`convert_vmamba_official`)."""
    family = official_family(sd)
    if family == 'vmamba':
        return convert_vmamba_official(sd, with_head)
    if family == 'vim':
        return convert_vim_official(sd, with_head)
    raise ConfigError('not an official Vim or VMamba state dict (expected patch_embed.* and '
                      'layers.* keys without a backbone. prefix)')


def convert_vim_official(sd: Mapping[str, torch.Tensor],
                         with_head: bool = True) -> 'OrderedDict[str, torch.Tensor]':
    """Official Vim weights -> an mmpretrain ``ImageClassifier`` state dict (pure function).

    ``backbone.<key>`` for every backbone weight; ``head.weight/bias`` -> ``head.fc.weight/bias``
    (``LinearClsHead``) when ``with_head``. RoPE buffers of other variants are dropped.
    """
    if not is_official_vim(sd):
        raise ConfigError('not an official Vim state dict: expected keys patch_embed.proj.weight '
                          'and layers.*')
    out = OrderedDict()
    for k, v in sd.items():
        if k in IGNORED_KEYS:
            continue
        if k in OFFICIAL_HEAD_KEYS:
            if with_head:
                out['head.fc.' + k.split('.')[-1]] = v
            continue
        out['backbone.' + k] = v
    return out


def as_model_checkpoint(checkpoint):
    """A loaded official Vim, VMamba or Vim-segmentation file in the layout mmengine loads into
    a whole model (official segmentation files: :func:`convert_vim_seg_official`).

    Official files hold ``{"model": {<backbone keys>, <head keys>}, ...}`` (or the bare state
    dict); mmengine would look for ``state_dict`` and load nothing. They are returned as
    ``{"state_dict": convert_official(...), "meta": {...}}``, the layout of an mmpretrain
    ``ImageClassifier``; any other checkpoint is returned unchanged.
    """
    if not isinstance(checkpoint, Mapping):
        return checkpoint
    if 'state_dict' in checkpoint:
        sd = checkpoint['state_dict']
        if isinstance(sd, Mapping) and is_official_vim_seg(sd):
            return dict(checkpoint, state_dict=convert_vim_seg_official(sd),
                        meta=dict(converted_from='official Vim segmentation checkpoint'))
        return checkpoint
    sd = checkpoint.get('model', checkpoint)
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        return checkpoint
    family = official_family(sd)
    if family is None:
        return checkpoint
    return dict(state_dict=convert_official(sd, with_head=True),
                meta=dict(converted_from=f'official {"VMamba" if family == "vmamba" else "Vim"}'
                          ' checkpoint'))


def backbone_state_dict(sd: Mapping[str, torch.Tensor],
                        prefix: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], list]:
    """Reduce any supported file's weights to backbone keys; returns (state dict, dropped keys).

    ``prefix`` selects a sub-module (``'backbone.'`` is detected automatically for files written
    by mmseg/mmdet/mmpretrain or by our converter). The classifier head is dropped on purpose.
    """
    if prefix is None and any(k.startswith('backbone.') for k in sd):
        prefix = 'backbone.'
    dropped = []
    out = OrderedDict()
    for k, v in sd.items():
        if prefix:
            if not k.startswith(prefix):
                dropped.append(k)
                continue
            k = k[len(prefix):]
        if k in OFFICIAL_HEAD_KEYS or k in IGNORED_KEYS:
            dropped.append(k)
            continue
        out[k] = v
    return out, dropped


def load_backbone_checkpoint(model: nn.Module, filename: str, strict: bool = True,
                             prefix: Optional[str] = None,
                             map_location: str = 'cpu') -> Tuple[list, list]:
    """Load a Vim-family backbone strictly from an official file or one of ours.

    ``filename`` is a path, a URL or a prefixed name (``torchvision://``...), read through the
    allow-list loader (:func:`~amvim_mm.utils.remote_checkpoint.load_checkpoint`). Every
    missing or unexpected key is reported by name; with ``strict`` (default) any mismatch
    raises :class:`CheckpointMismatchError`. A position embedding for another grid is resized by
    the model's load hook. Returns (missing, unexpected).
    """
    logger = MMLogger.get_current_instance()
    filename = os.fspath(filename)
    sd = extract_state_dict(load_checkpoint(filename, map_location=map_location))
    if is_official_vim_seg(sd):      # the official dense layout: the same key map as whole loads
        sd = convert_vim_seg_official(sd)
    sd, dropped = backbone_state_dict(sd, prefix)
    if dropped:
        head = [k for k in dropped if k.startswith('head')]
        msg = f'{filename}: not loaded into the backbone (on purpose): {len(dropped)} keys'
        if head:
            msg += f', including the classifier head {head}'
        logger.info(msg)
    name = type(model).__name__
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:
        raise CheckpointMismatchError(
            f'{filename} does not fit {name}(embed_dims={getattr(model, "embed_dims", "?")}, '
            f'num_layers={getattr(model, "num_layers", "?")}): {e}') from None
    if missing or unexpected:
        text = (f'{filename} vs {name}: '
                + (f'missing keys ({len(missing)}): {list(missing)}; ' if missing else '')
                + (f'unexpected keys ({len(unexpected)}): {list(unexpected)}' if unexpected
                   else ''))
        if strict:
            raise CheckpointMismatchError(
                text + '. Check the arch (depth/width) of the model and the file; pass '
                "init_cfg=dict(type='Pretrained', checkpoint=..., strict=False) to load anyway.")
        logger.warning(text)
    else:
        logger.info(f'{filename}: loaded {len(sd)} tensors into {name} (all keys matched)')
    return list(missing), list(unexpected)
