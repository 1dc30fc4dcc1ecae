"""Which code runs in one forward, decided once per forward for every family: the execution
plan (:mod:`.plan`), the facts it is made from and the rules every family shares
(:mod:`.facts`), and one file of route rules per family (:mod:`.vim`, :mod:`.plain_mamba`,
:mod:`.vmamba`, :mod:`.vil`). A backbone's ``execution_plan(x)`` returns the plan; block ``i``
gets ``plan.block(i)``, the reduction step before block ``i`` gets ``plan.step(i)``."""
from .facts import (BlockFacts, ForwardFacts, MixerFacts, PlannedBlock, ReducerFacts,
                    forward_facts, image_size, plan_family, plan_step, plan_steps,
                    reducer_facts)
from .plain_mamba import plan_plain_mamba
from .plan import (CPU, NO_KERNEL, ROUTES, TORCH, TRITON, TRITON_TRAIN, BlockPlan, Choice,
                   ExecutionPlan, StepPlan)
from .vil import plan_vil
from .vim import call_facts, plan_vim
from .vmamba import plan_vmamba

__all__ = ['CPU', 'NO_KERNEL', 'ROUTES', 'TORCH', 'TRITON', 'TRITON_TRAIN', 'BlockFacts',
           'BlockPlan', 'Choice', 'ExecutionPlan', 'ForwardFacts', 'MixerFacts', 'PlannedBlock',
           'ReducerFacts', 'StepPlan', 'call_facts', 'forward_facts', 'image_size', 'plan_family',
           'plan_plain_mamba', 'plan_step', 'plan_steps', 'plan_vil', 'plan_vim',
           'plan_vmamba', 'reducer_facts']
