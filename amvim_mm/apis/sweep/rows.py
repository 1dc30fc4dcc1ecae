"""A sweep's row: :class:`SweepRow` (the fields of one (model, method, ratio, precision) cell in
``results.json``), its key, its fingerprint and its ratio-0 baseline.

The store and the report read rows as the plain dicts of ``results.json`` (rows written by older
versions lack fields); :meth:`SweepRow.to_dict` gives the dict a cell's evaluation writes, with
the keys in the order the file has always had them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

Fingerprint = Tuple[Optional[str], Optional[str]]


class _Absent:
    """The value of a field the row does not have (not written, unlike None, which is null)."""

    def __repr__(self) -> str:
        return 'ABSENT'


ABSENT = _Absent()


@dataclass
class SweepRow:
    """One cell of a sweep as stored in ``results.json`` (see :mod:`amvim_mm.apis.sweep`).

    Fields left :data:`ABSENT` are not written. The first group is what every evaluation
    writes; ``seeds`` .. ``seed_std`` come with several pruning seeds, ``fine_tuned`` with the
    learned reducer, ``img_per_s`` .. ``speed_device`` with ``--measure-speed`` (the backbone
    alone and the whole model through the library's test step, at the test loader's batch;
    else ``img_per_s_test_loop`` on a GPU); ``drop`` is set by the merge and the intervals by
    the final pass. Keys a row read from the file has beyond these stay in ``extra``, and
    :meth:`to_dict` writes a row read by :meth:`from_dict` with the keys in its file order.
    """

    model: str
    config: str
    checkpoint: str
    method: str
    ratio: float
    precision: str
    protocol: str
    #: the reducer's config (None at ratio 0)
    reduction: Optional[dict]
    realised_ratio: float
    gflops: float
    gflops_convention: str
    metric_name: str
    #: the metric recomputed from the per-image statistics (mean over pruning seeds)
    metric: float
    #: the library's rounded value (mean over pruning seeds)
    metric_library: float
    final_tokens: int
    seconds: float
    images: int
    #: the per-image statistics, relative to the out-dir
    stats_file: str
    checkpoint_sha256: Optional[str]
    config_sha256: Optional[str]
    seeds: object = ABSENT
    metric_seeds: object = ABSENT
    seed_std: object = ABSENT
    fine_tuned: object = ABSENT
    img_per_s: object = ABSENT
    speed_batch: object = ABSENT
    speed_spread_pct: object = ABSENT
    img_per_s_model: object = ABSENT
    speed_spread_model_pct: object = ABSENT
    speed_mode: object = ABSENT
    speed_device: object = ABSENT
    img_per_s_test_loop: object = ABSENT
    drop: object = ABSENT
    ci_low: object = ABSENT
    ci_high: object = ABSENT
    drop_ci_low: object = ABSENT
    drop_ci_high: object = ABSENT
    relative_drop: object = ABSENT
    relative_drop_ci_low: object = ABSENT
    relative_drop_ci_high: object = ABSENT
    #: the version of the method's rule, where it is above 1 (:data:`~.methods.METHOD_VERSIONS`)
    method_version: object = ABSENT
    extra: Dict[str, object] = field(default_factory=dict, repr=False)
    key_order: Tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def field_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ('extra', 'key_order')]

    @classmethod
    def from_dict(cls, d: dict) -> 'SweepRow':
        """A row of ``results.json`` (fields it lacks stay :data:`ABSENT`)."""
        names = cls.field_names()
        return cls(**{n: d.get(n, ABSENT) for n in names},
                   extra={k: v for k, v in d.items() if k not in names}, key_order=tuple(d))

    def to_dict(self) -> dict:
        """The dict ``results.json`` holds: the present fields, then ``extra``; a row read by
        :meth:`from_dict` keeps its keys' order (new keys after them)."""
        out = {n: getattr(self, n) for n in self.field_names()
               if getattr(self, n) is not ABSENT}
        out.update(self.extra)
        if not self.key_order:
            return out
        first = {k: out[k] for k in self.key_order if k in out}
        first.update((k, v) for k, v in out.items() if k not in first)
        return first


def row_key(r: dict) -> Tuple[str, str, float, str]:
    """A row's identity in ``results.json``: (model, method, ratio, precision)."""
    return (r['model'], r['method'], round(float(r['ratio']), 6), r.get('precision', 'fp32'))


def fingerprint(r: dict) -> Fingerprint:
    """What produced a row: (checkpoint sha256, config sha256); (None, None) for old rows."""
    return (r.get('checkpoint_sha256'), r.get('config_sha256'))


def zero_of(rows: Sequence[dict], r: dict) -> Optional[dict]:
    """The ratio-0 row for ``r``: same model and precision (same method if there is one) and
    the same checkpoint and config hashes; else None."""
    zeros = [z for z in rows if round(float(z['ratio']), 6) == 0.0 and z['model'] == r['model']
             and z.get('precision', 'fp32') == r.get('precision', 'fp32')
             and fingerprint(z) == fingerprint(r)]
    same = [z for z in zeros if z['method'] == r['method']]
    return (same or sorted(zeros, key=lambda z: z['method']) or [None])[0]


def set_drops(rows: List[dict]) -> None:
    """``drop`` = metric - metric of the ratio-0 row (:func:`zero_of`); else None."""
    for r in rows:
        base = zero_of(rows, r)
        r['drop'] = round(r['metric'] - base['metric'], 4) if base is not None else None
