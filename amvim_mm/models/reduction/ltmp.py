"""LTMP for scans: learned merge and prune thresholds, two scalars per block.

LTMP ("Learned Thresholds Token Merging and Pruning", TMLR 2023) gives every block two learnable
thresholds and merges / prunes the tokens whose score passes them, so the number of tokens
depends on the image. Adapted to the Vim family (no attention; the scan needs order):

* **importance** (prune score) = ToP's score of the previous block's mixer output (sum over
  channels of ``max(0, y)``, summed over the paths), divided by its mean over the image's
  present patch tokens (one scalar threshold per block is then meaningful);
* **similarity** (merge score) = cosine of the block's normalised input (our ToMe metric);
  bipartite over the present patch tokens in sequence order (A = every other one, starting with
  the first; B = the rest); an A token merges into its most similar B token when the similarity
  passes the block's merge threshold, **in place** (size-weighted mean at the B token's position;
  LTMP's ``[src..., dst...]`` relayout would scramble the scan);
* then every present patch token that was neither merged away nor received a merge in this
  step (**decision**: a token carrying merged mass is not pruned in the same step) is pruned
  when its importance does not pass the prune threshold; the class token never merges nor
  prunes;
* a destination keeps its own importance (LTMP takes the maximum over the merged tokens; ours
  is the destination's own score of the previous block, the same in training and inference);
* thresholds: ``sigmoid((v - theta) / tau) > 0.5`` forward, the sigmoid's gradient backward
  (:class:`~.threshold_masker.ThresholdMasker`); init merge 0.9, prune 0 (LTMP);
* training objective term: ``reg_scale * (r_FLOPs - target)^2`` with ``r_FLOPs`` the mean over
  the blocks of the kept fraction each runs on (every block of a Vim-family backbone costs the
  same per token: LTMP's FLOPs ratio for a model linear in tokens); the classification loss is
  the model's own. LTMP trains the thresholds only, one epoch (``ReducerFineTuner(...,
  train_only_reducer=True)``).

Training runs the masked forward of :mod:`.learned` (masks enter each path's scan exactly;
merges update both streams in place). Inference removes the same tokens physically, one image
at a time (the counts differ per image).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from .learned import Decision, LearnedReducer
from .learned_losses import linear_flops_ratio
from .reducers import TOKEN_REDUCERS, Selection, _patch_indices
from .settings import check_int_list, check_number
from .threshold_masker import ThresholdMasker


def _metric(stream: torch.Tensor, layer) -> torch.Tensor:
    """Cosine-similarity features: the block's normalised input (its ``merge_metric``; a Vim
    block's RMSNorm: ``x * w`` up to a per-token scale), unit length, at least fp32."""
    dt = torch.promote_types(stream.dtype, torch.float32)
    with torch.autocast(stream.device.type, enabled=False):
        if hasattr(layer, 'merge_metric'):      # the layer's own normalised input
            return F.normalize(layer.merge_metric(stream).to(dt), dim=-1)
        m = stream.to(dt) * layer.norm.weight.to(dt)
        return F.normalize(m, dim=-1)


@TOKEN_REDUCERS.register_module(name='LTMP')
class LTMPReducer(LearnedReducer):
    """LTMP's learned merge / prune thresholds (see the module docstring).

    Args:
        blocks: the blocks before which the thresholds act (default: every block but the
            first; block ``l``'s scores come from block ``l - 1``): a non-empty list of ints
            >= 1.
        merge_init: the initial merge threshold (LTMP: 0.9), in [-1, 1): it is compared with a
            cosine similarity (in [-1, 1]); an A token merges when its similarity is strictly
            above it, so at 1 or above no token could ever merge, and below -1 the value is
            outside the score's domain (every pair merges, as at -1).
        prune_init: the initial prune threshold (LTMP: 0.0), in [0, 1): it is compared with
            the importance divided by its mean over the image's present tokens (>= 0, mean 1);
            a token is pruned when its score is at or below it, so below 0 no token could ever
            be pruned, and from 1 on an image whose tokens are equally important would lose
            them all (below 1 the tokens of above-average importance stay).
        tau: the sigmoid's temperature, in (0, inf) (at inf the sigmoid is 0.5 everywhere:
            no token merges and every patch token is pruned).
        target: ``r_FLOPs`` target (LTMP's ``--reduction-target``, 0.75), the FLOPs fraction
            kept, in (0, 1].
        reg_scale: weight of the FLOPs term (LTMP's ``--reg-scale``, 10), in [0, inf).
        merge, prune: switch either part off (LTMP's merge-only / prune-only variants).
    """

    dynamic = True
    needs_importance = True
    merges = True
    prunes = True

    def __init__(self, blocks: Optional[Sequence[int]] = None, merge_init: float = 0.9,
                 prune_init: float = 0.0, tau: float = 0.1, target: float = 0.75,
                 reg_scale: float = 10.0, merge: bool = True, prune: bool = True) -> None:
        super().__init__(r=0)
        if blocks is not None:
            blocks = tuple(sorted(set(check_int_list('LTMP', 'blocks', blocks, low=1))))
        self.merge_init = check_number('LTMP', 'merge_init', merge_init, low=-1, high=1,
                                       high_open=True)
        self.prune_init = check_number('LTMP', 'prune_init', prune_init, low=0, high=1,
                                       high_open=True)
        self.tau = check_number('LTMP', 'tau', tau, low=0, low_open=True)
        self.target = check_number('LTMP', 'target', target, low=0, high=1, low_open=True)
        self.reg_scale = check_number('LTMP', 'reg_scale', reg_scale, low=0)
        if not (merge or prune):
            raise ConfigError('LTMP: merge and prune are both off')
        self.blocks = blocks
        self.merge, self.prune = bool(merge), bool(prune)
        self.merges = self.merge          # merge=False: a pruning reducer (dst always -1)
        self.merge_thresholds = nn.ModuleList()
        self.prune_thresholds = nn.ModuleList()
        self.reset_observed()

    # ------------------------------------------------------------------ structure
    def _blocks_for(self, depth: int) -> List[int]:
        blocks = list(self.blocks) if self.blocks is not None else list(range(1, depth))
        if blocks and blocks[-1] >= depth:
            raise ConfigError(f'LTMP: block {blocks[-1]} is out of range for {depth} blocks')
        return blocks

    def build(self, embed_dims: int, depth: int) -> None:
        n = len(self._blocks_for(depth))
        self.merge_thresholds.extend(ThresholdMasker(self.merge_init, self.tau)
                                     for _ in range(n))
        self.prune_thresholds.extend(ThresholdMasker(self.prune_init, self.tau)
                                     for _ in range(n))
        self.depth = depth

    def removals(self, num_patches: int, depth: int):
        self._blocks_for(depth)
        return [0] * depth           # data-dependent: see decision_blocks / step

    def decision_blocks(self, num_patches: int, depth: int) -> List[int]:
        return self._blocks_for(depth)

    def config(self) -> dict:
        return dict(type='LTMP', blocks=None if self.blocks is None else list(self.blocks),
                    merge_init=self.merge_init, prune_init=self.prune_init, tau=self.tau,
                    target=self.target, reg_scale=self.reg_scale, merge=self.merge,
                    prune=self.prune)

    def thresholds(self) -> dict:
        """The current thresholds (for logs and reports)."""
        return dict(merge=[float(m.threshold) for m in self.merge_thresholds],
                    prune=[float(m.threshold) for m in self.prune_thresholds])

    # ------------------------------------------------------------------ observed counts
    def reset_observed(self) -> None:
        """Forget the token counts recorded by inference forwards."""
        self._observed: List[List[int]] = []

    def observe(self, counts: Sequence[int]) -> None:
        self._observed.append(list(counts))

    def mean_tokens(self) -> List[float]:
        """The per-block token counts (class token included) averaged over the images since
        :meth:`reset_observed`: LTMP's FLOPs are per image means."""
        if not self._observed:
            raise ConfigError('LTMP: no image was evaluated yet; its token counts (and FLOPs) '
                              'depend on the images')
        return [sum(c) / len(c) for c in zip(*self._observed)]

    # ------------------------------------------------------------------ training
    def begin(self, batch, num_patches, depth, device):
        super().begin(batch, num_patches, depth, device)
        self._blocks = self._blocks_for(depth)
        self._keep = None
        self._size = None
        self._fractions: List[Optional[torch.Tensor]] = [None] * depth

    def decide(self, block, stream, ctx, layer):
        if block not in self._blocks:
            return None
        j = self._blocks.index(block)
        B, L, _ = stream.shape
        dev = stream.device
        is_patch = (ctx.pos.to(dev) >= 0).expand(B, L)
        if self._keep is None:
            dt = torch.promote_types(stream.dtype, torch.float32)
            self._keep = torch.ones(B, L, device=dev, dtype=dt)
            self._size = torch.ones(B, L, device=dev, dtype=dt)
        keep, size = self._keep, self._size
        mix, receives = None, torch.zeros(B, L, dtype=torch.bool, device=dev)
        if self.merge:
            kp = (keep > 0.5) & is_patch
            rank = kp.long().cumsum(1) - 1
            a, b = kp & (rank % 2 == 0), kp & (rank % 2 == 1)
            m = _metric(stream, layer)
            sim = m @ m.transpose(1, 2)
            sim = sim.masked_fill(~b.unsqueeze(1), -2.0)
            best, dst = sim.max(-1)                                      # (B, L)
            can = a & b.any(1, keepdim=True)
            merged = self.merge_thresholds[j](best).to(size.dtype) * can  # STE, 0 / 1
            w = merged * size
            add = torch.zeros_like(size).scatter_add(1, dst, w)
            receives = add.detach() > 0
            old_size = size

            def mix(t: torch.Tensor, w=w, dst=dst, add=add, old=old_size, rec=receives):
                tf = t.to(torch.promote_types(t.dtype, w.dtype))
                acc = tf * old.unsqueeze(-1)
                acc = acc.scatter_add(1, dst.unsqueeze(-1).expand_as(tf), tf * w.unsqueeze(-1))
                out = acc / (old + add).clamp_min(1e-12).unsqueeze(-1)
                return torch.where(rec.unsqueeze(-1), out, tf).to(t.dtype)

            keep = keep * (1 - merged)
            size = size + add
        if self.prune:
            imp = ctx.importance
            if imp is None:
                raise RuntimeError('LTMP: no importance from the previous block')
            kp = (keep > 0.5) & is_patch
            mean = (imp * kp).sum(1, keepdim=True) / kp.sum(1, keepdim=True).clamp_min(1)
            v = imp / mean.clamp_min(1e-12)
            p = self.prune_thresholds[j](v).to(keep.dtype)
            p = torch.where(is_patch & ~receives, p, torch.ones_like(p))
            keep = keep * p
        self._keep, self._size = keep, size
        self._fractions[block] = (keep * is_patch).sum(1) / is_patch.sum(1)
        self.decisions.append(keep)
        return Decision(keep, mix)

    def flops_ratio(self) -> torch.Tensor:
        """``r_FLOPs`` of the last training forward: the mean over the blocks of the kept patch
        fraction each runs on (a tensor with the thresholds' gradient)."""
        fr, cur = [], None
        for f in self._fractions:
            cur = f if f is not None else cur
            fr.append(cur.mean() if cur is not None else torch.ones((), device=self._policy.device))
        return linear_flops_ratio(fr, [1.0] * len(fr))

    def loss_terms(self):
        if not self.decisions:
            return {}
        r = self.flops_ratio()
        return dict(loss_flops=self.reg_scale * (r - self.target) ** 2,
                    flops_ratio=r.detach())

    # ------------------------------------------------------------------ inference
    def step(self, block, k, stream, ctx, layer, route=None) -> Optional[Selection]:
        """One image's merges and prunes before ``block`` (hard thresholds, as in training;
        PyTorch ops on every route)."""
        j = self._blocks_for(self.depth).index(block)
        total = stream.total()
        if total.shape[0] != 1:
            raise ConfigError('LTMP: inference runs one image at a time')
        idx = _patch_indices(ctx)                                       # (1, n)
        removed, dst = [], []
        merged_away = torch.zeros_like(idx, dtype=torch.bool)
        receivers = torch.zeros_like(idx, dtype=torch.bool)
        if self.merge and idx.shape[1] >= 2:
            a_pos, b_pos = idx[:, 0::2], idx[:, 1::2]
            m = _metric(total, layer)
            ma = m[0, a_pos[0]]
            mb = m[0, b_pos[0]]
            best, partner = (ma @ mb.t()).max(-1)
            go = self.merge_thresholds[j](best).detach() > 0.5
            removed.append(a_pos[0, go])
            dst.append(b_pos[0, partner[go]])
            merged_away[0, 0::2] = go
            rec = torch.zeros(b_pos.shape[1], dtype=torch.bool, device=idx.device)
            rec[partner[go]] = True
            receivers[0, 1::2] = rec
        if self.prune:
            imp = ctx.importance
            if imp is None:
                raise RuntimeError('LTMP: no importance from the previous block')
            s = imp[0, idx[0]]
            present = ~merged_away[0]
            v = s / (s[present].sum() / present.sum().clamp_min(1)).clamp_min(1e-12)
            drop = (self.prune_thresholds[j](v).detach() <= 0.5) & present & ~receivers[0]
            removed.append(idx[0, drop])
            dst.append(torch.full_like(idx[0, drop], -1))
        if not removed:
            return None
        removed = torch.cat(removed)[None]
        dst = torch.cat(dst)[None]
        return Selection(removed, dst, None)
