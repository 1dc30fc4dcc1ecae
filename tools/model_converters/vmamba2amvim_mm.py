"""Convert an official VMamba ImageNet checkpoint into a clean amvim_mm / mmpretrain checkpoint.

    python tools/model_converters/vmamba2amvim_mm.py vssm1_tiny_0230s_ckpt_epoch_264.pth \
        vmamba-t_in1k.pth [--backbone-only]

The official file (weights under "model", plus "model_ema", optimizer state and a yacs
"config", read as plain data) becomes ``{"state_dict": {...}, "meta": {...}}`` with mmpretrain's
keys: ``backbone.*`` (``classifier.norm`` included: the classifier input norm of
``out_type='avg_featmap'``) and ``head.fc.weight/bias`` from ``classifier.head``;
``--backbone-only`` drops the head. Read with ``weights_only=True``, written atomically. The
result loads strictly into configs/vmamba/*_in1k-224.py (``tools/test.py``) and, through
``init_cfg=dict(type='Pretrained', checkpoint=...)``, into any VMamba backbone. (Our
``tools/test.py`` and ``init_cfg`` also take the official file directly.)
"""
import sys

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.convert import convert_main


def main(argv=None) -> int:
    return convert_main('vmamba', __doc__, argv)


if __name__ == '__main__':
    sys.exit(run_cli(main))
