"""Count the files a reduced Vim block crosses: one Vim-test forward at CPU inference with a
ToMe step before block 2, traced with ``sys.settrace``; the route from the reduction step before
block 2 up to the step before block 3 as the sequence of amvim_mm files execution moves
through (each change of file counted once). Run from a checkout of the project:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/runs/2026-12-03_route_trace/route_trace.py
"""
import pathlib
import sys

import torch

import amvim_mm  # noqa: F401  (registers the models)
from amvim_mm.registry import MODELS

ROOT = str(pathlib.Path(amvim_mm.__file__).parent)


def main(step_block: int = 2) -> None:
    torch.manual_seed(0)
    model = MODELS.build(dict(type='Vim', arch='test', img_size=32, patch_size=8,
                              out_type='featmap', out_indices=(-1, ),
                              token_reduction=dict(type='ToMe', r=[0, 0, 3, 0])))
    model.eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)                      # warm caches (kernels probed, orders built)
    route, state = [], {'on': False, 'done': False}

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
                route.append(name)
        return tracer

    sys.settrace(tracer)
    try:
        with torch.no_grad():
            model(x)
    finally:
        sys.settrace(None)
    print(f'{len(route) - 1} changes of file, {len(set(route))} distinct files:')
    print(' -> '.join(route))


if __name__ == '__main__':
    main()
