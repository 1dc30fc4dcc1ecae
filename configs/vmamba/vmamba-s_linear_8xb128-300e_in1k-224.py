# VMamba-S (s2l15) ImageNet-1k classifier, total batch 1024 (8 GPUs x 128), 300 epochs.
# Recipe: ./vmamba-t_linear_8xb128-300e_in1k-224.py; drop path 0.3 (official).
# Published (VMamba): Top-1 83.6, 50M params, 8.7G FLOPs.
_base_ = ['./vmamba-t_linear_8xb128-300e_in1k-224.py']
model = dict(backbone=dict(arch='small', drop_path_rate=0.3), head=dict(in_channels=768))
