"""Where each token sits: the class-token slot and position codes (:mod:`amvim_mm.token_layout`,
shared with the kernel wrappers of ``amvim_mm.ops``), scan orders as ranks over the patch grid
(:mod:`.scan_orders`) and the context of a sequence with its path indices (:mod:`.scan_context`).
Depends on nothing else of ``amvim_mm.models``."""
from amvim_mm.token_layout import CLS_POS, FUSED_POS, NO_CLS, cls_index_for, cls_slot
from .scan_context import PathIndex, ScanContext

__all__ = ['PathIndex', 'ScanContext', 'CLS_POS', 'FUSED_POS', 'NO_CLS', 'cls_slot',
           'cls_index_for']
