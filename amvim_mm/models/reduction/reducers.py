"""Token reducers for Vim-family backbones: ToMe, RandomPrune, EViT and ToP.

A reducer owns a :class:`~.schedule.ReductionSchedule` and, before a block that the schedule
names, chooses which patch tokens leave and where they go (merged into a survivor or pruned);
:func:`~.state.reduce_tokens` then applies that to both streams, keeping the survivors in their
original order. Reducers are registered in ``TOKEN_REDUCERS`` under the names ``ToMe``,
``RandomPrune``, ``EViT`` and ``ToP`` and switched on by a backbone argument
``token_reduction=dict(type='ToMe', ratio=0.17)`` or by ``TokenReductionHook``.
"""
from __future__ import annotations

import hashlib
from typing import FrozenSet, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger
from mmengine.registry import Registry

from amvim_mm import runtime
from amvim_mm.errors import ConfigError, LookupConfigError
from amvim_mm.ops import cpu_ops
from amvim_mm.ops import token_merge as tm
from . import margins
from .schedule import ReductionSchedule
from ..execution.plan import StepPlan
from .settings import check_number
from .state import Streams
from ..layout.constants import constant_cache
from ..layout.sorting import stable_argsort

TOKEN_REDUCERS = Registry('token reducer', scope='amvim_mm')
ALIGN_DELTAS = ('bias', 'token')


def build_reducer(cfg: Union[dict, 'TokenReducer', None]) -> Optional['TokenReducer']:
    """Build a reducer from a config dict (``None`` means no reduction)."""
    if cfg is None or isinstance(cfg, TokenReducer):
        return cfg
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise ConfigError(f'token_reduction must be a dict with a "type" key, got {cfg!r}')
    cfg = dict(cfg)
    name = cfg.pop('type')
    cls = TOKEN_REDUCERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise LookupConfigError(f'unknown token_reduction type {name!r}; choose one of '
                                f'{sorted(TOKEN_REDUCERS.module_dict)}')
    try:
        return cls(**cfg)
    except ConfigError:   # a TypeError too, but it already names the reducer and the value
        raise
    except TypeError as e:  # unexpected keyword: name it
        raise ConfigError(f'token_reduction {name}: {e}') from None


def _patch_indices(ctx) -> torch.Tensor:
    """(B, n) sequence indices of the patch tokens, in sequence order: every token but the
    class token (at ``cls_index``) and EViT's fused token (always the last one,
    :func:`~.state.append_fused_slot`) is a patch."""
    idx = _regular_patch_indices(ctx.n_patches, ctx.cls_index, str(ctx.pos.device))
    return idx.expand(ctx.pos.shape[0] if ctx.pos.dim() == 2 else 1, -1)


@constant_cache(256)
def _bipartite_sets(n: int, cls_index: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """ToMe's token sets A and B ((ceil(n / 2),), (floor(n / 2),) int64, contiguous) of the
    canonical CPU layout: every other patch token in sequence order."""
    idx = _regular_patch_indices(n, cls_index, 'cpu')[0]
    return idx[0::2].contiguous(), idx[1::2].contiguous()


@constant_cache(256)
def _regular_patch_indices(n: int, cls_index: int, device: str) -> torch.Tensor:
    idx = torch.arange(n)
    if cls_index >= 0:
        idx = idx + (idx >= cls_index).long()
    return idx.unsqueeze(0).to(device)


class Selection(NamedTuple):
    """One reduction step's choice: ``removed`` (B, r) sequence indices, ``dst`` (B, r) the
    survivor each merges into (-1: pruned), ``weight`` (B, L) merge weights or None (token
    sizes), ``plan``: the fused path's merge plan when the selecting kernel made it in the
    same launch (``(MergePlan, pos, size, source)``, see :func:`~.state.plan_merge_step`), and
    ``reduced``: the step already applied at CPU inference (``(hidden, pos, size, source)``
    of the reduced sequence, the streams folded into ``hidden``; see
    :func:`~.state.folded_successor`)."""

    removed: torch.Tensor
    dst: torch.Tensor
    weight: Optional[torch.Tensor] = None
    plan: Optional[tuple] = None
    reduced: Optional[tuple] = None


class TokenReducer:
    """Base class: a schedule plus a rule to pick the tokens that leave.

    Args (schedule, exactly one of): ``ratio`` (AMVim protocol, in [0, 1)), ``r`` (a
    non-negative int at ``locations`` or a list per block), ``keep_rate`` in (0, 1] with
    ``locations`` (ToP protocol; the blocks *after* which tokens are pruned, ints >= 0). See
    :mod:`amvim_mm.models.reduction.schedule`.
    """

    #: trained with the backbone (DynamicViT, LTMP): a masked training forward, a fine-tuner
    learned: bool = False
    #: the number of tokens removed depends on the image (thresholds): inference runs image by
    #: image and the token counts are means over the evaluated images (FLOPs)
    dynamic: bool = False
    #: reducers that rank tokens by the ToP importance of the previous block's mixer
    needs_importance = False
    #: hidden-state alignment mode for the later blocks (None: off)
    align: Optional[str] = None

    def __init__(self, ratio: Optional[float] = None, r=None, keep_rate: Optional[float] = None,
                 locations: Optional[Sequence[int]] = None) -> None:
        name = type(self).__name__
        self.schedule = ReductionSchedule.build(ratio=ratio, r=r, keep_rate=keep_rate,
                                                locations=locations, name=name)

    def removals(self, num_patches: int, depth: int):
        counts = self.schedule.removals(num_patches, depth, name=type(self).__name__)
        if self.needs_importance and counts and counts[0] > 0:
            raise ConfigError(f'{type(self).__name__} ranks tokens by the previous block\'s '
                              'importance, so it cannot reduce before block 0; use '
                              'keep_rate with locations (the blocks after which to prune)')
        return counts

    def token_plan(self, num_patches: int, depth: int, cls_token: bool = False
                   ) -> Tuple[List[int], List[int], float]:
        """``(removals, tokens, realised_ratio)``: the patch tokens removed before each block,
        the tokens each block sees (the class token and EViT's fused token included) and the
        realised ratio (for FLOPs counters). A :attr:`dynamic` reducer's counts depend on the
        image: they are the means over the images it evaluated (:meth:`mean_tokens`)."""
        if self.dynamic:
            counts = list(self.mean_tokens())
            present = [t - int(cls_token) for t in counts]
            removals = [p0 - p1 for p0, p1 in zip([num_patches] + present[:-1], present)]
            realised = sum(num_patches - c for c in present) / (depth * num_patches)
            return removals, counts, realised
        removals = list(self.removals(num_patches, depth))
        counts = ReductionSchedule.token_counts(removals, num_patches, cls_token=cls_token)
        if self.freeze_sources:   # the fused token, from the first step on
            first = next((j for j, k in enumerate(removals) if k), None)
            if first is not None:
                counts = [t + (j >= first) for j, t in enumerate(counts)]
        return removals, counts, ReductionSchedule.realised_ratio(removals, num_patches)

    def mean_tokens(self) -> List[float]:
        """A :attr:`dynamic` reducer's per-block token counts averaged over the images it
        evaluated (the class token included)."""
        raise NotImplementedError(f'{type(self).__name__} is not dynamic: its token counts '
                                  'follow from its schedule (token_plan)')

    def select(self, block: int, k: int, stream: Streams, ctx, layer
               ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Return (removed, dst, weight) for :func:`~.state.reduce_tokens`.

        ``stream``: the block's input streams (:class:`~.state.Streams`; ``stream.total()`` is
        ``residual + hidden``); ``layer``: the block about to run.
        """
        raise NotImplementedError

    def step(self, block: int, k: int, stream: Streams, ctx, layer, route: StepPlan
             ) -> Selection:
        """The selection of one reduction step, as the :class:`~.session.ReductionSession`
        asks for it, on ``route`` (the forward's :class:`~amvim_mm.models.execution.StepPlan`
        for this step). The default is :meth:`select` (PyTorch ops); a reducer with kernels of
        its own (:attr:`step_kernels`) overrides this and follows the route, and may hand over
        a merge plan made in the same launch (:attr:`Selection.plan`) or the step already
        applied (:attr:`Selection.reduced`)."""
        return Selection(*self.select(block, k, stream, ctx, layer))

    #: the step routes this reducer has kernels for besides :meth:`select`
    #: (:class:`~amvim_mm.models.execution.StepPlan`): 'triton' (a matching kernel that plans
    #: the merge in the same launch) and 'cpu' (the whole step in one compiled call)
    step_kernels: FrozenSet[str] = frozenset()
    #: the reducer matches on the block's normalised input (a block's own ``merge_metric``
    #: is PyTorch's, so the compiled step steps aside for it)
    block_metric = False

    #: the reducer merges removed tokens into survivors (else: they are pruned)
    merges = False
    #: a merging reducer that also prunes some tokens (``dst = -1``) must say so: their last
    #: features are then kept for the dense restore (None: ``not merges``)
    prunes: Optional[bool] = None
    freeze_sources = False

    @property
    def drops_patches(self) -> bool:
        """Whether a step can leave grid patches without a carrier (pruned, or merged into
        EViT's fused token): a dense restore then needs their last features."""
        return (not self.merges if self.prunes is None else self.prunes) or self.freeze_sources

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.schedule})'


@TOKEN_REDUCERS.register_module(name='ToMe')
class ToMe(TokenReducer):
    """Order-preserving bipartite soft matching (ToMe adapted to scans).

    Patch tokens (class token excluded) alternate into sets A and B in the current order; each
    A token's most similar B token (cosine similarity of ``metric``) is its edge; the ``r``
    strongest edges merge their A token into the B token with a size-weighted average, in both
    streams. The merged token keeps the B token's grid position, and every survivor stays in
    its original order (ToMe's own ``merge`` reorders tokens, which a scan cannot afford).

    Args:
        metric: ``'norm_input'`` (the block's normalised input, default) or ``'stream'`` (the
            raw residual stream).
    """

    merges = True

    def __init__(self, *args, metric: str = 'norm_input', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if metric not in ('norm_input', 'stream'):
            raise ConfigError(f"ToMe: metric must be 'norm_input' or 'stream', got {metric!r}")
        self.metric = metric

    @staticmethod
    def max_merge(n: int) -> int:
        """The most tokens one bipartite step can merge when ``n`` patch tokens are present.

        Set A (every other patch token, ``ceil(n / 2)`` of them) merges into set B
        (``floor(n / 2)``), so at most ``ceil(n / 2)`` leave, and none when B is empty
        (``n < 2``). The class token is in neither set and is never merged.
        """
        return (n + 1) // 2 if n >= 2 else 0

    def removals(self, num_patches: int, depth: int):
        counts = super().removals(num_patches, depth)
        n = num_patches
        for block, k in enumerate(counts):
            if k > self.max_merge(n):
                raise ConfigError(
                    f'ToMe: the schedule merges {k} tokens before block {block}, but only {n} '
                    f'patch tokens are present there and one bipartite step merges at most '
                    f'{self.max_merge(n)} (half of them, rounded up; the class token is never '
                    f'merged); lower r or ratio (schedule {list(counts)} for {num_patches} '
                    f'patch tokens)')
            n -= k
        return counts

    @property
    def step_kernels(self) -> FrozenSet[str]:
        """ToMe's matching kernel (Triton), and the whole step compiled for the CPU while
        :meth:`select` is this class's (a subclass's own choice is kept)."""
        if type(self).select is ToMe.select:
            return frozenset({'triton', 'cpu'})
        return frozenset({'triton'})

    @property
    def block_metric(self) -> bool:
        return self.metric == 'norm_input'

    def step(self, block, k, stream, ctx, layer, route: StepPlan) -> Selection:
        """On the step's ``route``: ``match='triton'``: ToMe's matching kernel
        (:func:`~amvim_mm.ops.token_merge.tome_match`), which also plans the merge (in the same
        launch while the patch tokens fit its tile, ``MAX_MATCH_ROWS``; in blocks beyond);
        ``'cpu'``: the whole step in one compiled call (:func:`~amvim_mm.ops.cpu_ops.tome_step`,
        bit for bit :meth:`select` and the folded merge); else :meth:`select`, its choice of
        edges compiled where ``route.edges`` says so. A count the step cannot merge goes to
        :meth:`select`, which names the problem."""
        n = ctx.n_patches
        match = route.match if 0 < k <= self.max_merge(n) else 'torch'
        w = layer.norm.weight if self.metric == 'norm_input' and match != 'torch' else None
        if match == 'cpu':
            a_idx, b_idx = _bipartite_sets(n, ctx.cls_index)
            hidden, pos, size, source, removed, dst = cpu_ops.tome_step(
                stream.hidden, stream.residual, w, ctx.size, ctx.pos, ctx.source, a_idx, b_idx,
                k, n, ctx.cls_index)
            return Selection(removed, dst, reduced=(hidden, pos, size, source))
        if match == 'triton':
            # fp32-accurate dot products whatever the autocast dtype (see select)
            removed, dst, plan = tm.tome_match(
                stream.hidden, stream.residual, w, n, ctx.cls_index, k,
                plan_state=(ctx.pos, ctx.size, ctx.source))
            return Selection(removed, dst, None, plan)
        if type(self).select is ToMe.select:
            return Selection(*self._select(block, k, stream, ctx, layer, route))
        return super().step(block, k, stream, ctx, layer, route)

    def select(self, block, k, stream, ctx, layer):
        """:meth:`_select` on PyTorch ops only (the reference of the step's other routes)."""
        return self._select(block, k, stream, ctx, layer, None)

    def _select(self, block, k, stream, ctx, layer, route: Optional[StepPlan]):
        """The matching in fp32 whatever the autocast dtype: the gap between the last merged
        and the first kept edge is often below bf16's resolution, so a 16-bit similarity
        changes which tokens merge. Ties go to the lower index (A token for the edge ranking,
        B token for an A token's partner), as in the matching kernel. ``route``: the step's
        (None: PyTorch, recording when a recorder is on); its ``edges='cpu'`` (CPU
        inference): where every sample has one layout, the compiled
        :func:`~amvim_mm.ops.cpu_ops.tome_edges` takes the choice of edges from the scores
        (the same decisions). The scores stay PyTorch's: a compiled similarity in another
        summation order flipped near-ties on the demo's data (segmentation cells by
        0.01-0.07 mIoU)."""
        if isinstance(stream, torch.Tensor):
            stream = Streams(stream, None)
        idx = _patch_indices(ctx)
        a_idx, b_idx = idx[:, 0::2], idx[:, 1::2]
        if k > a_idx.shape[1] or b_idx.shape[1] == 0:
            raise ConfigError(f'ToMe: cannot merge {k} tokens before block {block}: only '
                              f'{idx.shape[1]} patch tokens are left (at most '
                              f'{a_idx.shape[1] if b_idx.shape[1] else 0} can merge)')
        shared = idx.stride(0) == 0 or idx.shape[0] == 1    # one layout for every sample
        with torch.autocast(stream.hidden.device.type, enabled=False):
            m = stream.total().float()
            if self.metric == 'norm_input' and hasattr(layer, 'merge_metric'):
                m = layer.merge_metric(m).float()    # the block's own normalised input
            elif self.metric == 'norm_input':
                # cosine similarity of RMSNorm(x) = x / rms(x) * w: the 1 / rms cancels
                m = m * layer.norm.weight.float()
            m = F.normalize(m, dim=-1)
            d = m.shape[-1]
            if shared:   # whole-row copies (the same values as the gather, faster)
                ma, mb = m.index_select(1, a_idx[0]), m.index_select(1, b_idx[0])
            else:
                ma = torch.gather(m, 1, a_idx.unsqueeze(-1).expand(-1, -1, d))
                mb = torch.gather(m, 1, b_idx.unsqueeze(-1).expand(-1, -1, d))
            scores = ma @ mb.transpose(1, 2)
        record = margins.active() if route is None or route.record else None
        if record is not None:
            record.note(margins.matching_margin(scores, k))
        elif shared and route is not None and route.edges == 'cpu':
            # CPU inference: max, argsort and gathers in one compiled call (same decisions)
            removed, dst = cpu_ops.tome_edges(scores, a_idx[0], b_idx[0], k)
            return removed, dst, None
        node_max, node_idx = scores.max(dim=-1)      # ties: the first maximum (documented)
        edges = stable_argsort(node_max, dim=-1, descending=True)[:, :k]
        removed = torch.gather(a_idx, 1, edges)
        dst = torch.gather(b_idx, 1, torch.gather(node_idx, 1, edges))
        return removed, dst, None


def mask_seed(seed: int, image: str, block: int) -> int:
    """The generator seed of one image's random choice before one block: a hash of the
    reducer's seed, the image's identity and the block (so the choice does not depend on the
    batch the image is in, on its position there, or on the order of the images)."""
    digest = hashlib.sha256(f'{seed}\0{image}\0{block}'.encode()).digest()
    return int.from_bytes(digest[:8], 'little')


def _noise(seed: int, image: str, block: int, n: int) -> torch.Tensor:
    """One image's (n,) noise before one block (a CPU generator seeded by :func:`mask_seed`)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(mask_seed(seed, image, block)))


#: the batch positions an exported RandomPrune draws for (the graph holds their noise; the
#: images of a larger batch would have none)
EXPORT_POSITIONS = 64


@constant_cache(64)
def _position_noise(seed: int, block: int, n: int, rows: int) -> torch.Tensor:
    """(rows, n) the noise of the batch positions ``#0 .. #rows-1`` (images without keys)."""
    return torch.stack([_noise(seed, f'#{b}', block, n) for b in range(rows)])


@TOKEN_REDUCERS.register_module(name='RandomPrune')
class RandomPrune(TokenReducer):
    """Drop random patch tokens (same schedule as ToMe), drawn per image.

    The tokens an image loses before a block are a function of ``(seed, image, block)`` only
    (:func:`mask_seed`): the same in a batch of 1 and of 8, in any order and position, and
    different from image to image, so a test set sees as many masks as it has images. The
    images' identities (their file names) come from :meth:`set_image_keys`, which
    :class:`~amvim_mm.engine.hooks.ImageIdentityHook` (and ``TokenReductionHook``,
    ``tools/test.py``, ``tools/prune_eval.py``) calls before every test and validation batch.
    A forward without them falls back to the position in the batch as the identity, and the
    log says so once. An exported model (ONNX) knows no identities: its graph holds the noise
    of the first :data:`EXPORT_POSITIONS` batch positions, so it drops what an eager forward
    without image keys drops, for batches of up to that many images.

    Args:
        seed: an int in [0, 2**64 - 1] (a float would be truncated, so it is refused).
    """

    def __init__(self, *args, seed: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seed = check_number('RandomPrune', 'seed', seed, low=0, high=2 ** 64 - 1,
                                 integer=True)
        self.image_keys: Optional[List[str]] = None
        self._warned = False

    def set_image_keys(self, keys: Optional[Sequence[str]]) -> None:
        """The identities of the next forwards' images, one per sample (None: unknown)."""
        self.image_keys = None if keys is None else [str(k) for k in keys]

    def _keys(self, batch: int) -> List[str]:
        keys = self.image_keys
        if keys is not None and len(keys) == batch:
            return keys
        if not self._warned:
            self._warned = True
            MMLogger.get_current_instance().warning(
                f'RandomPrune: the identities of the {batch} images of this forward are '
                f'unknown ({"none given" if keys is None else f"{len(keys)} given"}); their '
                'masks follow their position in the batch. Use TokenReductionHook, '
                'ImageIdentityHook or set_image_keys for masks per image.')
        return [f'#{b}' for b in range(batch)]

    def select(self, block, k, stream, ctx, layer):
        idx = _patch_indices(ctx)
        B, n = idx.shape
        if k >= n:
            raise ConfigError(f'RandomPrune: cannot drop {k} of {n} tokens before block {block}')
        if runtime.exporting():   # the positions' noise as a constant, the batch sliced
            noise = _position_noise(self.seed, block, n, EXPORT_POSITIONS)[:B].to(idx.device)
            pick = noise.argsort(dim=1)[:, :k]
            removed = torch.gather(idx, 1, pick)
            return removed, torch.full_like(removed, -1), None
        # CPU generators: the same choices on any device
        noise = torch.stack([_noise(self.seed, key, block, n) for key in self._keys(B)])
        if idx.is_cuda:
            noise = noise.pin_memory().to(idx.device, non_blocking=True)
        else:
            noise = noise.to(idx.device)
        pick = noise.argsort(dim=1)[:, :k]
        removed = torch.gather(idx, 1, pick)
        return removed, torch.full_like(removed, -1), None


class _ImportanceReducer(TokenReducer):
    needs_importance = True

    def _lowest(self, block, k, ctx):
        imp = ctx.importance
        if imp is None:
            raise RuntimeError(f'{type(self).__name__}: no token importance before block '
                               f'{block} (the previous mixer did not record it)')
        idx = _patch_indices(ctx)
        if k >= idx.shape[1]:
            raise ConfigError(f'{type(self).__name__}: cannot remove {k} of {idx.shape[1]} '
                              f'tokens before block {block}')
        score = torch.gather(imp, 1, idx)
        record = margins.active()
        if record is not None:
            record.note(margins.ranking_margin(score, k))
        pick = score.argsort(dim=1)[:, :k]          # least important first
        return idx, torch.gather(idx, 1, pick)


@TOKEN_REDUCERS.register_module(name='ToP')
class ToP(_ImportanceReducer):
    """ToP-ViM: prune the least important tokens, then align the hidden states.

    Importance is ``sum over channels of max(0, y)`` of the previous block's SSM output (both
    paths, in token order, summed). In every later block each path scans the kept tokens as if
    the pruned ones were still there with zero input (gap folding, exact on every backend).

    Args:
        align: ``True`` (default) or ``False`` for plain pruning.
        gap_delta: the step size of a pruned position: ``'bias'`` (``softplus(dt_bias)``,
            **decision**: needs no feature of the pruned token) or ``'token'`` (the next kept
            token's own delta, the "A-bar to the power gap+1" reading).
    """

    def __init__(self, *args, align: bool = True, gap_delta: str = 'bias', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if gap_delta not in ALIGN_DELTAS:
            raise ConfigError(f"ToP: gap_delta must be one of {ALIGN_DELTAS}, got {gap_delta!r}")
        self.align = gap_delta if align else None

    def select(self, block, k, stream, ctx, layer):
        _, removed = self._lowest(block, k, ctx)
        return removed, torch.full_like(removed, -1), None


@TOKEN_REDUCERS.register_module(name='EViT')
class EViT(_ImportanceReducer):
    """EViT-style token recognition: keep the most important tokens, fuse the rest into one.

    Scores are the ToP importance (Mamba has no attention). The fused token is the
    score-weighted average of the inattentive tokens; **decision**: it is appended after the
    last patch token in every path. Its grid positions count as pruned for dense restore.
    """

    freeze_sources = True
    merges = True

    def select(self, block, k, stream, ctx, layer):
        _, removed = self._lowest(block, k, ctx)
        # the fused token is the last token of the sequence (see append_fused_slot)
        dst = torch.full_like(removed, ctx.pos.shape[1] - 1)
        weight = ctx.importance.clamp_min(0)
        return removed, dst, weight
