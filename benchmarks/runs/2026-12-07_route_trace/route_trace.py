"""Count the files a reduced block crosses, for Vim, ViL and PlainMamba: one 'test'-arch
forward at CPU inference with a ToMe step before block 2, traced with ``sys.settrace``; the
route from the reduction step before block 2 up to the step before block 3 as the sequence of
amvim_mm files execution moves through (each change of file counted once). The 2026-12-03
script, extended to the three families. Run from a checkout of the project:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/runs/2026-12-07_route_trace/route_trace.py [Vim|ViL|PlainMamba]
"""
import pathlib
import sys

import torch

import amvim_mm  # noqa: F401  (registers the models)
from amvim_mm.registry import MODELS

ROOT = str(pathlib.Path(amvim_mm.__file__).parent)


def build(family: str):
    red = dict(type='ToMe', r=[0, 0, 3, 0])
    if family == 'Vim':
        return MODELS.build(dict(type='Vim', arch='test', img_size=32, patch_size=8,
                                 out_type='featmap', out_indices=(-1, ), token_reduction=red))
    if family == 'ViL':     # v2 test arch: 4 block pairs
        return MODELS.build(dict(type='ViL', arch='test', img_size=64, out_indices=(-1, ),
                                 token_reduction=red))
    return MODELS.build(dict(type='PlainMamba', arch='test', img_size=64, out_indices=(-1, ),
                             token_reduction=red))


def main(family: str = 'Vim', step_block: int = 2) -> None:
    torch.manual_seed(0)
    model = build(family)
    model.eval()
    x = torch.randn(1, 3, *((32, 32) if family == 'Vim' else (64, 64)))
    with torch.no_grad():
        model(x)                      # warm caches (kernels probed, orders built)
    route, state = [], {'on': False, 'done': False, 'calls': 0}

    def tracer(frame, event, arg):
        if state['done']:
            return None
        f = frame.f_code.co_filename
        if event == 'call' and frame.f_code.co_name == 'before_block':
            i = frame.f_locals.get('i')
            if i == step_block:
                state['on'] = True
            elif i == step_block + 1 and state['on']:
                state['on'], state['done'] = False, True
        if not state['on']:
            return tracer
        here = f if event == 'call' else (frame.f_back.f_code.co_filename
                                          if event == 'return' and frame.f_back else f)
        if here.startswith(ROOT):
            name = here[len(ROOT) + 1:]
            if not route or route[-1] != name:
                state['calls'] += bool(route) and event == 'call'
                route.append(name)
                if event == 'call' and len(route) > 1:
                    state.setdefault('named', []).append(f'{name}:{frame.f_code.co_name}')
        return tracer

    sys.settrace(tracer)
    try:
        with torch.no_grad():
            model(x)
    finally:
        sys.settrace(None)
    print(f'{len(route) - 1} changes of file ({state["calls"]} of them calls into another '
          f'file), {len(set(route))} distinct files:')
    print(' -> '.join(route))
    if '--calls' in sys.argv:
        print('calls:', ', '.join(state.get('named', [])))


if __name__ == '__main__':
    main(*([a for a in sys.argv[1:2] if not a.startswith('--')] or ['Vim']))
