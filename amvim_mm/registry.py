"""Where amvim_mm's classes register: mmengine's root registries.

mmseg, mmdet and mmpretrain all build from child registries of mmengine's root ``MODELS`` /
``HOOKS`` (scopes ``mmseg``, ``mmdet``, ``mmpretrain``). A child registry that does not find a
type looks it up in its parent, so a class registered once in the root is found by plain type name
from all three default scopes (and from plain mmengine) after ``import amvim_mm`` or
``custom_imports=dict(imports=['amvim_mm'], allow_failed_imports=False)`` in a config.
"""
from mmengine.registry import HOOKS, MODELS

__all__ = ['MODELS', 'HOOKS']
