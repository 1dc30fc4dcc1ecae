"""Convert an official Vim ImageNet checkpoint into a clean amvim_mm / mmpretrain checkpoint.

    python tools/model_converters/vim2amvim_mm.py vim_t_midclstok_76p1acc.pth vim-t_in1k.pth
        [--backbone-only]

The official file (DeiT style: weights under "model", plus "args", an argparse.Namespace, and
optimizer state) becomes ``{"state_dict": {...}, "meta": {...}}`` with mmpretrain's keys:
``backbone.*`` and ``head.fc.weight/bias`` (``LinearClsHead``); ``--backbone-only`` drops the
head. The file is loaded with ``weights_only=True`` and written atomically. The result loads
strictly into the classification configs (``tools/test.py``) and, through
``init_cfg=dict(type='Pretrained', checkpoint=...)``, into any Vim/AMVim backbone.
"""
import argparse
import io
import os
import sys

import torch

from amvim_mm.apis.cli import run_cli
from amvim_mm.engine.fileio import atomic_write_bytes
from amvim_mm.errors import ConfigError
from amvim_mm.utils.checkpoint import convert_vim_official, extract_state_dict
from amvim_mm.utils.safe_load import load_checkpoint_file, mark_weights


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('src', help='official Vim checkpoint')
    p.add_argument('dst', help='output path')
    p.add_argument('--backbone-only', action='store_true', help='drop the classifier head')
    args = p.parse_args(argv)
    if os.path.isdir(args.dst):
        raise ConfigError(f'the output {args.dst} is a directory; give a file name')
    if os.path.exists(args.dst) and os.path.samefile(args.src, args.dst):
        raise ConfigError(f'the output {args.dst} is the input file; give another name (the '
                          'source would be overwritten)')
    sd = extract_state_dict(load_checkpoint_file(args.src))
    out = convert_vim_official(sd, with_head=not args.backbone_only)
    buf = io.BytesIO()
    meta = mark_weights(dict(source=args.src, converter='vim2amvim_mm'), out)
    torch.save(dict(state_dict=out, meta=meta), buf)
    atomic_write_bytes(buf.getvalue(), args.dst)
    n = sum(v.numel() for v in out.values())
    print(f'wrote {args.dst}: {len(out)} tensors, {n / 1e6:.2f}M parameters'
          + (' (backbone only)' if args.backbone_only else ''))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
