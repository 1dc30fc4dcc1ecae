# VMamba-B (s2l15, C = 128) ImageNet-1k classifier, total batch 1024 (8 GPUs x 128), 300
# epochs. Recipe: ./vmamba-t_linear_8xb128-300e_in1k-224.py; drop path 0.6 (official).
# Published (VMamba): Top-1 83.9, 89M params, 15.4G FLOPs.
_base_ = ['./vmamba-t_linear_8xb128-300e_in1k-224.py']
model = dict(backbone=dict(arch='base', drop_path_rate=0.6), head=dict(in_channels=1024))
