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
import sys

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.convert import convert_main


def main(argv=None) -> int:
    return convert_main('vim', __doc__, argv)


if __name__ == '__main__':
    sys.exit(run_cli(main))
