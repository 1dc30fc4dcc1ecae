"""Convert an official Vim segmentation checkpoint (hustvl/Vim ``seg/``) into our layout.

    python tools/model_converters/vim_seg2amvim_mm.py best_mIoU_iter_55000.pth vim-t_upernet.pth
        [--backbone-only]

The official UperNet keeps its feature pyramid inside the backbone (``backbone.fpn1.{0,1,3}``,
``backbone.fpn2.0``); ours is the ``PlainPyramidNeck`` (``neck.ops.0.*``, ``neck.ops.1.*``,
numerically the same ops). The position embedding gets the (unused) middle class-token slot and
a zero ``cls_token`` is added, so the result loads strictly into the official-code UperNet
configs (``configs/vim/*_official-code.py``); heads are unchanged. The same map is applied on
the fly when ``tools/test.py``, ``load_from`` or a backbone's ``init_cfg`` read an official file,
so converting is only needed to keep a clean copy. Files trained with RoPE (``rope.*`` buffers)
are refused: our Vim has no RoPE. Loaded with ``weights_only=True``, written atomically.
"""
import sys

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.convert import convert_main


def main(argv=None) -> int:
    return convert_main('vim_seg', __doc__, argv)


if __name__ == '__main__':
    sys.exit(run_cli(main))
