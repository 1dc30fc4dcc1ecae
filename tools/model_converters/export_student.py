"""Export the fine-tuned student of a ReducerFineTuner checkpoint as a plain model checkpoint.

    python tools/model_converters/export_student.py work_dirs/.../iter_600.pth student.pth

Keeps the model's weights with the learned reducer's (``backbone.token_reducer.*``), drops the
teacher and the optimizer state (about half the size). The result loads strictly into the
fine-tuning config itself (``tools/test.py``, ``tools/prune_eval.py --methods learned``) and into
the plain model config with the same ``token_reduction`` on its backbone. Read with
``weights_only=True``, written atomically.
"""
import sys

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.convert import export_student_main


def main(argv=None) -> int:
    return export_student_main(__doc__, argv)


if __name__ == '__main__':
    sys.exit(run_cli(main))
