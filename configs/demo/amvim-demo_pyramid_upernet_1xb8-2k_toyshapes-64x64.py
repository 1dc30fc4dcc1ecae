# Demo AMVim (D 64, 8 blocks, patch 8; path 2 = reversed 3x3 windows, column-major inside)
# + pyramid + UperNet on the built-in toy shapes. Same parameters as the Vim demo.
_base_ = ['../_base_/demo_toyshapes-64x64.py']
model = dict(backbone=dict(type='AMVim'))  # default: 3x3 windows, column-major inside
