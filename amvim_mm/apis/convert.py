"""Official checkpoint -> a clean amvim_mm / mmpretrain checkpoint (the converter tools' body).

The official file is read with ``weights_only=True`` (an allow-list of types), converted by a
pure function of :mod:`amvim_mm.utils.checkpoint` and written atomically as
``{"state_dict": {backbone.*, head.fc.*}, "meta": {source, converter, weights sha256}}``.
"""
from __future__ import annotations

import argparse
import io
import os
from typing import Optional, Sequence

import torch

from amvim_mm.engine.fileio import atomic_write_bytes
from amvim_mm.errors import ConfigError
from amvim_mm.utils.checkpoint import (convert_vim_official, convert_vim_seg_official,
                                       convert_vmamba_official, extract_state_dict)
from amvim_mm.utils.safe_load import load_checkpoint_file, mark_weights

CONVERTERS = {'vim': ('Vim', convert_vim_official), 'vmamba': ('VMamba', convert_vmamba_official),
              'vim_seg': ('Vim segmentation', convert_vim_seg_official)}


def convert_main(family: str, doc: str, argv: Optional[Sequence[str]] = None) -> int:
    """Command line of ``tools/model_converters/{family}2amvim_mm.py``."""
    name, convert = CONVERTERS[family]
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument('src', help=f'official {name} checkpoint')
    p.add_argument('dst', help='output path')
    p.add_argument('--backbone-only', action='store_true', help='keep the backbone only (a segmentation file: backbone and '
                   'neck; the heads are dropped)')
    args = p.parse_args(argv)
    if os.path.isdir(args.dst):
        raise ConfigError(f'the output {args.dst} is a directory; give a file name')
    if os.path.exists(args.dst) and os.path.samefile(args.src, args.dst):
        raise ConfigError(f'the output {args.dst} is the input file; give another name (the '
                          'source would be overwritten)')
    sd = extract_state_dict(load_checkpoint_file(args.src))
    out = convert(sd, with_head=not args.backbone_only)
    buf = io.BytesIO()
    meta = mark_weights(dict(source=args.src, converter=f'{family}2amvim_mm'), out)
    torch.save(dict(state_dict=out, meta=meta), buf)
    atomic_write_bytes(buf.getvalue(), args.dst)
    n = sum(v.numel() for v in out.values())
    print(f'wrote {args.dst}: {len(out)} tensors, {n / 1e6:.2f}M parameters'
          + (' (backbone only)' if args.backbone_only else ''))
    return 0


def student_state_dict(sd: dict) -> dict:
    """A ``ReducerFineTuner`` checkpoint's student as a plain model's state dict: ``student.*``
    without the prefix (the learned reducer's ``backbone.token_reducer.*`` included), the
    shared ``data_preprocessor.*``; the teacher dropped."""
    if not any(k.startswith('student.') for k in sd):
        raise ConfigError('the checkpoint has no student.* keys: not a ReducerFineTuner '
                          'checkpoint')
    out = {k[len('student.'):]: v for k, v in sd.items() if k.startswith('student.')}
    for k, v in sd.items():
        if k.startswith('data_preprocessor.'):
            out.setdefault(k, v)
    return out


def export_student_main(doc: str, argv: Optional[Sequence[str]] = None) -> int:
    """Command line of ``tools/model_converters/export_student.py``."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument('src', help='a ReducerFineTuner training checkpoint')
    p.add_argument('dst', help='output path')
    args = p.parse_args(argv)
    if os.path.isdir(args.dst):
        raise ConfigError(f'the output {args.dst} is a directory; give a file name')
    if os.path.exists(args.dst) and os.path.samefile(args.src, args.dst):
        raise ConfigError(f'the output {args.dst} is the input file; give another name')
    ck = load_checkpoint_file(args.src)
    out = student_state_dict(extract_state_dict(ck))
    src_meta = ck.get('meta') if isinstance(ck, dict) else None
    src_meta = src_meta if isinstance(src_meta, dict) else {}
    meta = mark_weights(dict(source=args.src, converter='export_student',
                             epoch=src_meta.get('epoch'), iter=src_meta.get('iter')), out)
    buf = io.BytesIO()
    torch.save(dict(state_dict=out, meta=meta), buf)
    atomic_write_bytes(buf.getvalue(), args.dst)
    red = sum(1 for k in out if '.token_reducer.' in k)
    print(f'wrote {args.dst}: {len(out)} tensors ({red} of the learned reducer), teacher dropped')
    return 0
