"""Parameter counts of the models that configs build (no weights loaded, nothing downloaded).

    python tools/count_params.py configs/vmamba/vmamba-t_upernet_4xb4-160k_ade20k-512x512.py \
        [CONFIG ...]

Builds each config's model from its own library's registry (mmseg, mmdet or mmpretrain) with
the backbone's ``init_cfg`` switched off, and prints its parameters in millions (the whole
model, and the backbone alone).
"""
import argparse
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
import amvim_mm  # noqa: F401,E402
from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.apis.runner import build_model, load_config  # noqa: E402


def count(config: str):
    model = build_model(load_config(config), config)
    total = sum(p.numel() for p in model.parameters())
    backbone = getattr(model, 'backbone', None)
    bb = sum(p.numel() for p in backbone.parameters()) if backbone is not None else None
    return total, bb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('configs', nargs='+', help='config files')
    args = p.parse_args(argv)
    print('| config | parameters (M) | backbone (M) |')
    print('|---|---|---|')
    for config in args.configs:
        total, bb = count(config)
        print(f'| {config} | {total / 1e6:.2f} | '
              f'{"" if bb is None else f"{bb / 1e6:.2f}"} |', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
