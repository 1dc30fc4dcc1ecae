"""Argument checks shared by every backbone: one-line ``ConfigError`` messages that
name the backbone, the argument, the value and what is allowed."""
from __future__ import annotations

import numbers
from typing import List, Sequence, Tuple

from amvim_mm.errors import ConfigError


def is_int(v) -> bool:
    """An int-like value (Python or NumPy integer), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def positive_int(name: str, arg: str, v) -> int:
    if not is_int(v) or v < 1:
        raise ConfigError(f'{name}: {arg} must be a positive int, got {v!r}')
    return int(v)


def size_pair(name: str, arg: str, v) -> Tuple[int, int]:
    """An int or a pair of ints, all positive -> (H, W)."""
    pair = (v, v) if is_int(v) else v
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or \
            not all(is_int(x) and x >= 1 for x in pair):
        raise ConfigError(f'{name}: {arg} must be a positive int or a pair (H, W) of positive '
                          f'ints, got {v!r}')
    return int(pair[0]), int(pair[1])


def rate(name: str, arg: str, v) -> float:
    """A probability in [0, 1) (dropout, stochastic depth)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
        raise ConfigError(f'{name}: {arg} must be a number in [0, 1), got {v!r}')
    return float(v)


def resolve_out_indices(name: str, out_indices, n: int, unit: str) -> List[int]:
    """``out_indices`` (an int or a non-empty sequence of ints, negatives from the end) ->
    sorted distinct indices in ``0..n-1``; ``unit`` names what is indexed (layers, stages)."""
    if is_int(out_indices):
        out_indices = [out_indices]
    # a string is a Sequence too: '3' must not be read as block 3 (nor '10' as 1 and 0)
    if not isinstance(out_indices, Sequence) or isinstance(out_indices, (str, bytes)) \
            or len(out_indices) == 0 or not all(is_int(i) for i in out_indices):
        raise ConfigError(f'{name}: out_indices must be an int or a non-empty sequence of '
                          f'ints, got {out_indices!r}')
    resolved = []
    for i in map(int, out_indices):
        j = n + i if i < 0 else i
        if not 0 <= j < n:
            raise ConfigError(f'{name}: out_indices {i} is out of range for {n} {unit}')
        resolved.append(j)
    return sorted(set(resolved))

