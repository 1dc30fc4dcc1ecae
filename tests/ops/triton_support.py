"""What the Triton tests share: whether Triton imports, and the skip marker for when it does not
(the kernels then run nowhere; on CPU they run in Triton's interpreter)."""
import pytest

try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason='triton is not installed')
