# Demo Vim (D 64, 8 blocks, patch 8) + pyramid + UperNet on the built-in toy shapes.
_base_ = ['../_base_/demo_toyshapes-64x64.py']
