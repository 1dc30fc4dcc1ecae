"""Outputs of every backbone type with and without each reducer, saved for a bit-for-bit
comparison of two commits (issue 53: the planner must not change a number). CPU inference
(the compiled kernels where they apply), then the same with them switched off, then one
training-mode forward with gradients (the PyTorch routes). Run from a checkout (or with
``PYTHONPATH`` at a worktree of another commit):

    OMP_NUM_THREADS=1 python identity.py OUT.pt
    python identity.py --compare A.pt B.pt
"""
import sys

import torch

TYPES = dict(Vim=dict(img_size=32, patch_size=8), AMVim=dict(img_size=32, patch_size=8),
             LocalVim=dict(img_size=32, patch_size=8), PlainMamba=dict(img_size=64),
             ViL=dict(img_size=64), AMViL=dict(img_size=64), VMamba=dict(img_size=64))
REDUCERS = dict(none=None, tome=dict(type='ToMe', r=2), random=dict(type='RandomPrune', ratio=0.2),
                evit=dict(type='EViT', keep_rate=0.8, locations=(1, )),
                top=dict(type='ToP', keep_rate=0.8, locations=(1, )))


def run(out: str) -> None:
    import amvim_mm  # noqa: F401
    from amvim_mm import runtime
    from amvim_mm.registry import MODELS
    res = {}
    for name, kw in TYPES.items():
        for red, cfg in REDUCERS.items():
            torch.manual_seed(0)
            try:
                m = MODELS.build(dict(type=name, arch='test', out_indices=(-1, ),
                                      token_reduction=cfg, **kw)).eval()
            except Exception as e:     # noqa: BLE001  (a combination a type refuses)
                res[(name, red)] = f'refused: {type(e).__name__}'
                continue
            x = torch.randn(2, 3, kw['img_size'], kw['img_size'],
                            generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                res[(name, red, 'eval')] = [o.clone() for o in m(x)]
                with runtime.override(cpu_kernels=False, reduction_kernels=False):
                    res[(name, red, 'eval-torch')] = [o.clone() for o in m(x)]
            if cfg is None or red in ('tome', 'random'):
                m.train()
                torch.manual_seed(2)
                outs = m(x)
                loss = sum(o.float().square().mean() for o in outs)
                loss.backward()
                res[(name, red, 'train')] = [o.detach().clone() for o in outs] + [
                    p.grad.clone() for p in m.parameters() if p.grad is not None]
    torch.save(res, out)
    print(f'{len(res)} cases -> {out}')


def compare(a: str, b: str) -> None:
    ra, rb = torch.load(a), torch.load(b)
    assert ra.keys() == rb.keys(), set(ra) ^ set(rb)
    diff = [k for k in ra if (isinstance(ra[k], str) and ra[k] != rb[k]) or (
        not isinstance(ra[k], str) and (len(ra[k]) != len(rb[k]) or not all(
            torch.equal(p, q) for p, q in zip(ra[k], rb[k]))))]
    print(f'{len(ra)} cases, {len(ra) - len(diff)} bit-identical; different: {diff}')


if __name__ == '__main__':
    if sys.argv[1] == '--compare':
        compare(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1])
