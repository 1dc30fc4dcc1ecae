"""Built-in data for the demo (imports mmseg: not imported by ``import amvim_mm``; configs add
``'amvim_mm.datasets'`` to ``custom_imports``)."""
from .toy_shapes import (ToyShapesDataset, make_toy_shapes, make_toy_shapes_cls,
                         make_toy_shapes_coco)

__all__ = ['ToyShapesDataset', 'make_toy_shapes', 'make_toy_shapes_coco', 'make_toy_shapes_cls']
