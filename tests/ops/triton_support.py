"""What the Triton tests share: whether Triton imports, and the skip marker for when it does not
(the kernels then run nowhere; on CPU they run in Triton's interpreter)."""
import pytest

try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')


def run_in_interpreter(script: str):
    """Run ``script`` in a fresh Python with ``TRITON_INTERPRET=1`` (set before Triton imports:
    the kernels then run on CPU tensors) and the fast interpreter shim; the JSON it prints
    after ``RESULT`` on its last such line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from amvim_mm.testing.triton_interpreter import PREAMBLE
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', PREAMBLE + script], env=env,
                          cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    return json.loads(line[len('RESULT'):])
