"""Analytic FLOPs of Vim-family backbones, with token reduction.

Convention (stated in every result): multiply-accumulates of the linear layers, the patch
embedding and the depthwise conv count one FLOP each (fvcore's convention), and the selective
scan counts ``9 * L * E * N`` per path (the mamba-ssm maintainers' convention), for every path,
with the sequence length ``L`` each block actually sees under the reduction schedule.
Element-wise activations, norms and the reducers' own matching cost are not counted.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

CONVENTION = ('MACs of linear/conv layers + selective scan 9*L*E*N per path (mamba-ssm '
              'convention), per-block token counts; norms, activations and reducer cost '
              'excluded')


def vim_family_flops(model, input_shape: Union[int, Tuple[int, int]] = 224,
                     token_reduction: Optional[dict] = 'model',
                     num_classes: int = 0) -> Dict[str, object]:
    """FLOPs of ``model`` (a Vim-family backbone) for one image.

    Args:
        model: a ``Vim``/``AMVim``/``LocalVim`` instance.
        input_shape: image size (int or (H, W)).
        token_reduction: ``'model'`` uses the model's own reducer, ``None`` none, or a config
            dict (e.g. ``dict(type='ToMe', ratio=0.17)``).
        num_classes: add a linear classifier head of this size (0: backbone only).

    Returns:
        dict with ``gflops``, ``tokens`` (sequence length per block), ``realised_ratio``,
        ``removals`` and ``convention``.
    """
    from amvim_mm.models.reduction import ReductionSchedule, build_reducer
    if isinstance(input_shape, int):
        input_shape = (input_shape, input_shape)
    gh, gw = model.patch_embed.grid_size(*input_shape)
    M = gh * gw
    depth = model.num_layers
    reducer = model.token_reducer if token_reduction == 'model' else build_reducer(
        token_reduction)
    removals = reducer.removals(M, depth) if reducer is not None else [0] * depth
    cls = int(model.with_cls_token)
    tokens = ReductionSchedule.token_counts(removals, M, cls_token=bool(cls))
    if reducer is not None and getattr(reducer, 'freeze_sources', False):
        # EViT's fused token joins from its first location on
        first = next((i for i, k in enumerate(removals) if k), None)
        if first is not None:
            tokens = [t + (i >= first) for i, t in enumerate(tokens)]
    D = model.embed_dims
    p = model.patch_embed.patch_size
    cin = model.patch_embed.proj.in_channels
    total = M * cin * p * p * D
    per_block = []
    for layer, L in zip(model.layers, tokens):
        mixer = layer.mixer
        E, N, R = mixer.d_inner, mixer.d_state, mixer.dt_rank
        K = mixer.path_params(0)[0].kernel_size[0]
        f = L * D * 2 * E + L * E * D                       # in_proj, out_proj
        f += mixer.num_paths * (L * E * K + L * E * (R + 2 * N) + L * R * E + 9 * L * E * N)
        if hasattr(mixer, 'attn'):                          # LocalVim channel attention
            red = mixer.attn.global_reduce.out_features
            f += mixer.num_paths * 2 * E * red
        per_block.append(f)
        total += f
    total += D * num_classes
    return dict(gflops=total / 1e9, tokens=tokens, removals=removals,
                realised_ratio=ReductionSchedule.realised_ratio(removals, M),
                per_block_gflops=[f / 1e9 for f in per_block], convention=CONVENTION)
