"""amvim_mm: pruning-robust vision Mamba backbones for OpenMMLab.

``import amvim_mm`` (or ``custom_imports=dict(imports=['amvim_mm'], allow_failed_imports=False)``
in a config) registers our models and hooks in mmengine's root registries, where the mmseg,
mmdet and mmpretrain scopes find them by plain type name, and registers the safe checkpoint
loader of :mod:`amvim_mm.utils.compat`. Nothing is printed at import.
"""
from .version import __version__
from .utils.compat import register_checkpoint_loader
from . import engine, models  # noqa: F401,E402  (registers the models and hooks)

register_checkpoint_loader()

__all__ = ['__version__']
