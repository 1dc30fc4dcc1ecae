"""Where and how many tokens a reducer removes (the AMVim and ToP protocols).

A schedule answers, for a sequence of ``M`` patch tokens and a backbone of ``depth`` blocks, how
many patch tokens to remove **before** each block. Three forms:

* ``ratio``: the AMVim protocol ("training-free ToMe"): ``r`` tokens removed at the start of the
  even blocks ``0, 2, ..., depth - 2``, with ``r = round(ratio * depth * M / S)`` where ``S`` is
  the sum over blocks of the number of reduction locations at or before it. For Vim-T at 224
  (``M = 196``, 24 blocks, ``S = 156``) the paper's labels 0.17/0.27/0.36/0.46 give r = 5/8/11/14,
  final lengths 137/101/65/29 (with the class token) and realised ratios
  0.166/0.265/0.365/0.464 (``6.5 r / 196``).
* ``r``: an int (removed at each of ``locations``, default the AMVim protocol's even blocks) or a
  list with one entry per block.
* ``keep_rate`` with ``locations``: the ToP/DynamicViT protocol: after each block in
  ``locations`` keep ``int(n * keep_rate)`` of the ``n`` present patch tokens (ToP-ViM: Tiny
  prunes after blocks 10 and 20, Small after 5, 10 and 15, keep rate 0.8).

The realised ratio is the mean fraction of the ``M`` patch tokens absent, averaged over all
blocks. Asking for more than the sequence can give is an error, never a silent clamp.

Accepted values: ``ratio`` a number in [0, 1) (0: no reduction; 1 would remove every token),
``keep_rate`` in (0, 1] (1: keep all; 0 keeps none), ``r`` and ``locations`` non-negative ints
(``r``: counts, ``locations``: block indices). NaN, infinities, bools and strings are refused
with a one-line error naming the key (:mod:`.settings`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from amvim_mm.errors import ConfigError
from .settings import check_number, int_list, is_int


@dataclass(frozen=True)
class ReductionSchedule:
    """A validated schedule; :meth:`removals` gives the per-block counts for a given ``M``."""

    ratio: Optional[float] = None
    r: Optional[Union[int, Sequence[int]]] = None
    keep_rate: Optional[float] = None
    locations: Optional[Sequence[int]] = None

    @staticmethod
    def build(ratio=None, r=None, keep_rate=None, locations=None,
              name: str = 'token_reduction') -> 'ReductionSchedule':
        given = [k for k, v in (('ratio', ratio), ('r', r), ('keep_rate', keep_rate))
                 if v is not None]
        if len(given) != 1:
            raise ConfigError(f'{name}: give exactly one of ratio, r or keep_rate '
                              f'(got {given or "none"})')
        if ratio is not None:
            check_number(name, 'ratio', ratio, low=0, high=1, high_open=True)
            if locations is not None:
                raise ConfigError(f'{name}: ratio uses the AMVim protocol locations; give r '
                                  'with locations instead')
        if keep_rate is not None:
            check_number(name, 'keep_rate', keep_rate, low=0, high=1, low_open=True)
        if r is not None:
            # anything but an int or a list of ints (2.5, '5', [2.5]...) is refused here
            rs = [r] if is_int(r) else int_list(r)
            if rs is None or any(x < 0 for x in rs):
                raise ConfigError(f'{name}: r must be a non-negative int or a list of them '
                                  f'(one per block), got {r!r}')
            if is_int(r):
                r = int(r)
            if not isinstance(r, int):
                if locations is not None:
                    raise ConfigError(f'{name}: a list r gives one count per block; do not '
                                      'also give locations')
                r = tuple(rs)
        if locations is not None:
            # a string is iterable too: '10' must not be read as blocks 1 and 0
            locs = [locations] if is_int(locations) else int_list(locations)
            if locs is None:
                raise ConfigError(f'{name}: locations must be a list of block indices (ints), '
                                  f'got {locations!r}')
            locations = tuple(locs)
            if any(x < 0 for x in locations):
                raise ConfigError(f'{name}: locations must be non-negative block indices, '
                                  f'got {locations}')
        if keep_rate is not None and not locations:     # None or empty (a single 0 is block 0)
            raise ConfigError(f'{name}: keep_rate needs locations (the blocks after which '
                              'tokens are pruned), e.g. locations=(9, 19)')
        return ReductionSchedule(ratio=ratio, r=r, keep_rate=keep_rate, locations=locations)

    # ------------------------------------------------------------------ protocol helpers
    @staticmethod
    def protocol_locations(depth: int) -> List[int]:
        """The AMVim protocol: reduce at the start of blocks 0, 2, ..., (even, < depth - 1)."""
        return list(range(0, depth - 1, 2)) or [0]

    @staticmethod
    def ratio_to_r(ratio: float, num_patches: int, depth: int) -> int:
        locs = ReductionSchedule.protocol_locations(depth)
        weight = sum(sum(1 for loc in locs if loc <= b) for b in range(depth))
        return int(round(ratio * depth * num_patches / weight))

    @staticmethod
    def importance_locations(depth: int) -> List[int]:
        """Default blocks after which an importance reducer (EViT, ToP) prunes: ToP-ViM's
        Tiny schedule (after the 10th and 20th of 24 blocks, 0-based 9 and 19) scaled to
        ``depth`` (8 blocks: 2 and 6)."""
        locs = sorted({min(max(round(depth * f / 24) - 1, 0), depth - 2) for f in (10, 20)})
        if depth < 2:
            raise ConfigError(f'an importance reducer needs at least 2 blocks, got {depth}')
        return locs

    @staticmethod
    def keep_rate_for_ratio(ratio: float, num_patches: int, depth: int,
                            locations: Sequence[int], step: float = 0.0005) -> float:
        """The keep rate (a multiple of ``step``) whose schedule at ``locations`` realises the
        ratio nearest to ``ratio`` (ties: the larger keep rate), so that importance reducers
        can be swept on the same ratio axis as ToMe; the realised ratio is reported with it."""
        best, best_err = 1.0, float('inf')
        for i in range(int(round(1 / step)), 0, -1):
            keep = round(i * step, 6)
            sched = ReductionSchedule(keep_rate=keep, locations=tuple(locations))
            try:
                rem = sched.removals(num_patches, depth)
            except ConfigError:
                break                      # a lower keep rate leaves no token
            err = abs(ReductionSchedule.realised_ratio(rem, num_patches) - ratio)
            if err < best_err - 1e-12:
                best, best_err = keep, err
        return best

    def removals(self, num_patches: int, depth: int, name: str = 'token_reduction'
                 ) -> List[int]:
        """Patch tokens to remove before each block (list of length ``depth``)."""
        out = [0] * depth
        if self.keep_rate is not None:
            n = num_patches
            for loc in sorted(self.locations):
                if loc >= depth - 1:
                    raise ConfigError(f'{name}: location {loc} has no block after it '
                                      f'(depth {depth})')
                keep = int(n * self.keep_rate)
                if keep < 1:
                    raise ConfigError(f'{name}: keep_rate {self.keep_rate} leaves no token '
                                      f'after block {loc} ({n} present)')
                out[loc + 1] += n - keep
                n = keep
            return out
        if self.ratio is not None:
            r = self.ratio_to_r(self.ratio, num_patches, depth)
            locs = self.protocol_locations(depth)
        elif isinstance(self.r, int):
            r = self.r
            locs = list(self.locations) if self.locations is not None else \
                self.protocol_locations(depth)
        else:
            if len(self.r) != depth:
                raise ConfigError(f'{name}: r has {len(self.r)} entries for {depth} blocks')
            out = list(self.r)
            locs = []
            r = 0
        for loc in locs:
            if loc >= depth:
                raise ConfigError(f'{name}: location {loc} is out of range for {depth} blocks')
            out[loc] += r
        total = sum(out)
        if total >= num_patches:
            raise ConfigError(
                f'{name}: the schedule removes {total} tokens but the input has only '
                f'{num_patches} patch tokens (at least one must stay); lower r or ratio')
        return out

    @staticmethod
    def realised_ratio(removals: Sequence[int], num_patches: int) -> float:
        depth = len(removals)
        gone, acc = 0, 0
        for n in removals:
            gone += n
            acc += gone
        return acc / (depth * num_patches)

    @staticmethod
    def token_counts(removals: Sequence[int], num_patches: int, cls_token: bool = True
                     ) -> List[int]:
        """Sequence length seen by each block (class token included when present)."""
        n = num_patches
        counts = []
        for k in removals:
            n -= k
            counts.append(n + int(cls_token))
        return counts
