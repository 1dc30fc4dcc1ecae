# Training-free token reduction at test time on PlainMamba-L3 at ToP-ViM's budget: ToP (importance
# = the clipped channel sum of the summed four-direction output; hidden-state alignment along each
# snake order) keeping 0.598 of the tokens after layers 9, 18 and 27 (counted from 1): 196 -> 117
# -> 69 -> 41 tokens, 8.447 GFLOPs (41.6 % fewer than 14.454 G; L3_TOP_BUDGET in
# amvim_mm/models/plain_mamba/plain_mamba.py). The paper reports 81.7 % Top-1 after 30 epochs of
# fine-tuning at this budget; training-free (this config) no number is published.
#   python tools/test.py THIS_CONFIG pretrain/l3.pth
# Other methods / budgets: tools/prune_eval.py, or edit reduction below.
_base_ = ['./plainmamba-l3_linear_4xb256-300e_in1k-224.py']
custom_hooks = [
    dict(type='TokenReductionHook',
         reduction=dict(type='ToP', keep_rate=0.598, locations=(8, 17, 26)),
         phases=('val', 'test')),
]
