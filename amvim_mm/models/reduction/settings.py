"""Checks of the numeric settings of the token reducers and of their fine-tuner.

Every numeric constructor argument of a reducer (weights, temperatures, thresholds, rates,
seeds, block indices) goes through :func:`check_number` or :func:`check_int_list`, so that a
NaN, an infinity, a bool or a value outside the range the math needs stops the build with one
line that names the owner and the key (a :class:`~amvim_mm.errors.ConfigError`), instead of a
reducer that silently keeps every token, prunes them all or trains on a NaN loss.
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, List, Optional, Union

from amvim_mm.errors import ConfigError

INF = math.inf


def is_int(v) -> bool:
    """An int-like value (Python or NumPy integer), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def int_list(v) -> Optional[List[int]]:
    """``v`` as a list of ints if it is a non-string iterable of ints, else None."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
        return None
    v = list(v)
    return [int(x) for x in v] if all(is_int(x) for x in v) else None


def interval(low: float, high: float, low_open: bool = False, high_open: bool = False) -> str:
    """``[low, high)``-style text of a range; an infinite end is always open."""
    left = '(' if low_open or low == -INF else '['
    right = ')' if high_open or high == INF else ']'
    return f'{left}{low}, {high}{right}'


def check_number(owner: str, key: str, value, *, low: float = -INF, high: float = INF,
                 low_open: bool = False, high_open: bool = False,
                 integer: bool = False) -> Union[int, float]:
    """``value`` as a float (an int with ``integer=True``) if it is a finite real number in the
    range, else a one-line :class:`ConfigError` naming ``owner`` and ``key``.

    Bools are refused (``True`` is an int to Python, never a weight or a rate in a config), and
    so are strings, tensors, NaN and +-inf. With ``integer=True`` only ints (Python or NumPy)
    pass: ``2.0`` is refused rather than silently truncated.
    """
    kind = 'an int' if integer else 'a number'
    ok = isinstance(value, numbers.Integral if integer else numbers.Real) and \
        not isinstance(value, bool)
    if ok and not isinstance(value, numbers.Integral):
        ok = math.isfinite(value)
    if ok:
        ok = (low < value if low_open else low <= value) and \
            (value < high if high_open else value <= high)
    if not ok:
        raise ConfigError(f'{owner}: {key} must be {kind} in '
                          f'{interval(low, high, low_open, high_open)}, got {value!r}')
    return int(value) if integer else float(value)


def check_int_list(owner: str, key: str, value, *, low: int = 0) -> List[int]:
    """``value`` (an int or a non-empty non-string sequence of ints, each ``>= low``) as a list
    of ints, else a one-line :class:`ConfigError` naming ``owner`` and ``key``."""
    items = [value] if is_int(value) else int_list(value)
    if not items or any(x < low for x in items):
        raise ConfigError(f'{owner}: {key} must be a non-empty list of block indices (ints '
                          f'>= {low}), got {value!r}')
    return items
