# Demo AMVim classifier: the Vim classification demo with AMVim's scan paths (same parameters).
_base_ = ['../_base_/demo_toyshapes-cls-64x64.py']
model = dict(backbone=dict(type='AMVim'))
