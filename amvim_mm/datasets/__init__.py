"""Built-in data for the demo and data pipeline steps (imports mmseg and mmcv: not imported by
``import amvim_mm``; configs add ``'amvim_mm.datasets'`` to ``custom_imports``)."""
from .color_jitter import TorchvisionColorJitter
from .toy_shapes import (ToyShapesDataset, make_toy_shapes, make_toy_shapes_cls,
                         make_toy_shapes_coco)

__all__ = ['ToyShapesDataset', 'make_toy_shapes', 'make_toy_shapes_coco', 'make_toy_shapes_cls',
           'TorchvisionColorJitter']
