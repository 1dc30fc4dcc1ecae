"""The execution plan of one forward, the same shape for every family: which code runs in the
embedding, in each block and in each token-reduction step, and why.

A route is one of :data:`ROUTES`: ``'triton'`` (a Triton inference kernel), ``'triton-train'``
(a Triton kernel with its backward), ``'cpu'`` (a compiled CPU kernel) or ``'torch'``
(PyTorch ops, the reference of the others). A family's rules (one file per family in this
package) fill the plan from plain facts read once at the start of the forward; the blocks,
their mixers and ops and the reduction session only read their part of it: block ``i`` gets
``plan.block(i)``, the step before block ``i`` gets ``plan.step(i)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, NamedTuple, Optional, Tuple

__all__ = ['TRITON', 'TRITON_TRAIN', 'CPU', 'TORCH', 'ROUTES', 'Choice', 'StepPlan',
           'BlockPlan', 'ExecutionPlan', 'NO_KERNEL']

TRITON, TRITON_TRAIN, CPU, TORCH = 'triton', 'triton-train', 'cpu', 'torch'
ROUTES = (TRITON, TRITON_TRAIN, CPU, TORCH)


class Choice(NamedTuple):
    """One part's route and the reason for it (a few words)."""
    route: str
    why: str


#: a part that has no other implementation in this family
NO_KERNEL = Choice(TORCH, 'no kernel in this family')


@dataclass(frozen=True)
class StepPlan:
    """One token-reduction step (before block ``block``).

    ``match``: ``'triton'`` (the reducer's matching kernel, which plans the merge in the same
    launch), ``'cpu'`` (the whole step in one compiled call) or ``'torch'`` (the reducer's
    ``select``); ``merge``: ``'triton'`` (planned, applied inside the next block's Triton
    add + RMSNorm), ``'cpu'`` (compiled) or ``'torch'``; ``fold``: the two streams are merged
    as one (inference); ``edges``: inside ``select``, ToMe's choice of edges from its scores
    compiled (``'cpu'``) or in PyTorch; ``record``: a near-tie recorder is on
    (:mod:`amvim_mm.models.reduction.margins`: the PyTorch selection, which records);
    ``exporting``: an export records the step (no data-dependent check)."""
    block: int
    match: str
    merge: str
    fold: bool
    why: str
    edges: str = TORCH
    record: bool = False
    exporting: bool = False


@dataclass(frozen=True)
class BlockPlan:
    """One block's routes: its residual add + norm, its mixer, and the ops that have more than
    one implementation inside it (``ops``: (name, choice) pairs, e.g. the cross-scan or the
    aligned-scan inputs; :meth:`op`)."""
    add_norm: Choice
    mixer: Choice
    ops: Tuple[Tuple[str, Choice], ...] = ()

    def op(self, name: str) -> Choice:
        """The route of the op ``name`` inside this block (``torch`` when not planned)."""
        return next((c for n, c in self.ops if n == name), Choice(TORCH, 'not planned'))

    def uses(self, name: str, route: str = TRITON) -> bool:
        """Whether the op ``name`` runs on ``route``."""
        return self.op(name).route == route


@dataclass(frozen=True)
class ExecutionPlan:
    """What runs in one forward (see the module docstring). ``family``: the backbone type;
    ``fused``: whether the forward runs the Vim family's Triton kernels (``bool(plan)`` is
    it); ``facts``: what the plan was made from (the family's facts)."""
    family: str
    fused: bool
    fused_why: str
    embed: Choice
    blocks: Tuple[BlockPlan, ...]
    steps: Tuple[StepPlan, ...]
    facts: Any
    #: the steps by the block they run before (``step_at.get(i)``: :meth:`step` as a lookup)
    step_at: Dict[int, StepPlan] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, 'step_at', {s.block: s for s in self.steps})

    def block(self, i: Optional[int]) -> BlockPlan:
        """Block ``i``'s routes (numbered over all stages; a plan made for one call answers
        for any block)."""
        return self.blocks[0] if i is None or len(self.blocks) == 1 else self.blocks[i]

    def step(self, i: int) -> Optional[StepPlan]:
        """The plan of the reduction step before block ``i`` of the reducing stage (None: no
        step there)."""
        return self.step_at.get(i)

    def __bool__(self) -> bool:
        return self.fused

    def describe(self) -> str:
        """One line per part: route and reason (for logs, ``check_env --routes`` and docs)."""
        lines = [f'{self.family}: triton {self.fused} ({self.fused_why})',
                 f'embed: {self.embed.route} ({self.embed.why})']
        for i, b in enumerate(self.blocks):
            ops = ''.join(f', {n} {c.route} ({c.why})' for n, c in b.ops)
            lines.append(f'block {i}: add+norm {b.add_norm.route} ({b.add_norm.why}), '
                         f'mixer {b.mixer.route} ({b.mixer.why}){ops}')
        lines += [f'step before block {s.block}: match {s.match}, merge {s.merge}, '
                  f'fold {s.fold}, edges {s.edges} ({s.why})' for s in self.steps]
        return '\n'.join(lines)
