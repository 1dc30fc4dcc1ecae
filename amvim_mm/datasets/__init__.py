"""Built-in data for the demo (imports mmseg: not imported by ``import amvim_mm``; configs add
``'amvim_mm.datasets'`` to ``custom_imports``)."""
from .toy_shapes import ToyShapesDataset, make_toy_shapes

__all__ = ['ToyShapesDataset', 'make_toy_shapes']
