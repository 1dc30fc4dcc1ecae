from .pyramid import LayerNorm2d, PlainPyramidNeck, SimpleFeaturePyramid

__all__ = ['PlainPyramidNeck', 'SimpleFeaturePyramid', 'LayerNorm2d']
