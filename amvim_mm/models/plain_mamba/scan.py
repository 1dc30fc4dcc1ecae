"""PlainMamba's four snake directions on a grid: the visiting orders, the direction code of each
step (the index of the mixer's learned ``direction_Bs``) and the per-cell tables a reduced
sequence reads its codes from."""
from __future__ import annotations

from typing import Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.ops.cross_scan import DirectionIndex
from ..layout.constants import constant_cache
from ..layout.scan_orders import normalize_order, scan_rank

#: the four directions: row snake, its reverse, column snake, its reverse (official order)
SNAKE_DIRECTIONS = (dict(order='snake', axis='row'), dict(order='snake', axis='row', reverse=True),
                    dict(order='snake', axis='col'), dict(order='snake', axis='col', reverse=True))
#: the same, normalised once (the scan context's cache keys)
SNAKE_KEYS = tuple(normalize_order(d) for d in SNAKE_DIRECTIONS)

#: direction codes (index of ``direction_Bs``): 0 start, 1 right, 2 left, 3 up, 4 down
MOVE_CODES = {(0, 1): 1, (0, -1): 2, (-1, 0): 3, (1, 0): 4}


def move_codes(order: torch.Tensor, W: int) -> torch.Tensor:
    """(L,) raster positions in visiting order -> (L,) code of the move arriving at each step
    (0 at the first step; a non-neighbouring jump is refused)."""
    i, j = order // W, order % W
    di, dj = (i[1:] - i[:-1]).tolist(), (j[1:] - j[:-1]).tolist()
    codes = [0]
    for a, b in zip(di, dj):
        if (a, b) not in MOVE_CODES:
            raise ConfigError(f'a snake order jumps by ({a}, {b}): not a neighbouring cell')
        codes.append(MOVE_CODES[(a, b)])
    return torch.tensor(codes, dtype=torch.long)


@constant_cache(64)
def snake_directions(H: int, W: int, device) -> Tuple[DirectionIndex, torch.Tensor]:
    """The four directions of an H x W grid: their :class:`DirectionIndex` (perm (4, 1, L))
    and the direction codes of each step (4, L), cached per grid and device (built outside any
    trace: constants of an exported graph)."""
    orders = []
    for spec in SNAKE_DIRECTIONS:
        order = torch.argsort(scan_rank(H, W, {k: v for k, v in spec.items()
                                               if k != 'reverse'}))
        orders.append(order.flip(0) if spec.get('reverse') else order)
    perm = torch.stack(orders)
    codes = torch.stack([move_codes(o, W) for o in orders])
    return DirectionIndex.from_perm(perm[:, None].to(device)), codes.to(device)


@constant_cache(64)
def snake_cell_tables(H: int, W: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per direction and grid cell (both (4, H * W + 1) long, the extra column for a token
    without a cell): the cell's step in the direction's full-grid order (its rank; ``H * W``
    for the extra column) and the code of the move arriving at it (0 for the extra column)."""
    index, codes = snake_directions(H, W, device)
    perm = index.perm[:, 0]                                            # (4, L): cell at step
    M = H * W
    steps = torch.full((4, M + 1), M, dtype=torch.long, device=device)
    steps[:, :M] = index.inv[:, 0].long()
    cell_codes = torch.zeros(4, M + 1, dtype=torch.long, device=device)
    cell_codes[:, :M].scatter_(1, perm, codes)
    return steps, cell_codes


def displacement_codes(cells: torch.Tensor, W: int) -> torch.Tensor:
    """(..., L) grid cells in a direction's visiting order -> the code of each step recomputed
    from the displacement to the previous present cell (the ``'displacement'`` option for
    reduced sequences): the larger of the row and column moves decides (the column move on a
    tie), its sign the code; 0 at the first step and for a token without a cell (< 0)."""
    i, j = torch.div(cells, W, rounding_mode='floor'), cells % W
    di, dj = i[..., 1:] - i[..., :-1], j[..., 1:] - j[..., :-1]
    horiz = dj.abs() >= di.abs()
    code = torch.where(horiz, torch.where(dj > 0, 1, 2), torch.where(di > 0, 4, 3))
    code = torch.cat([torch.zeros_like(code[..., :1]), code], -1)
    valid = cells >= 0
    prev_valid = torch.cat([torch.zeros_like(valid[..., :1]), valid[..., :-1]], -1)
    return torch.where(valid & prev_valid, code, torch.zeros_like(code))
