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
from amvim_mm.utils.checkpoint import (convert_vim_official, convert_vmamba_official,
                                       extract_state_dict)
from amvim_mm.utils.safe_load import load_checkpoint_file, mark_weights

CONVERTERS = {'vim': ('Vim', convert_vim_official), 'vmamba': ('VMamba', convert_vmamba_official)}


def convert_main(family: str, doc: str, argv: Optional[Sequence[str]] = None) -> int:
    """Command line of ``tools/model_converters/{family}2amvim_mm.py``."""
    name, convert = CONVERTERS[family]
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument('src', help=f'official {name} checkpoint')
    p.add_argument('dst', help='output path')
    p.add_argument('--backbone-only', action='store_true', help='drop the classifier head')
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
