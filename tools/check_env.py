"""Print the versions that matter to amvim_mm and check the install.

Usage: python tools/check_env.py [--quiet] [--routes]

``--routes`` also prints which kernel each part of a reduced Vim-T, VMamba-T, PlainMamba-L1
and ViL-T forward runs on this machine, and why (the execution plans).

Exits non-zero, naming the fix, when the install is broken.
"""
import argparse
import sys

from amvim_mm.bench.environment import collect_env
from amvim_mm.bench.routes import route_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quiet', action='store_true', help='print only problems')
    parser.add_argument('--routes', action='store_true',
                        help="print the routes of reduced forwards (every family) on this machine")
    args = parser.parse_args()
    info, problems = collect_env()
    if not args.quiet:
        width = max(len(k) for k in info)
        for k, v in info.items():
            print(f'{k:<{width}} : {v}')
    for p in problems:
        print(f'PROBLEM: {p}', file=sys.stderr)
    if not args.quiet:
        print('environment OK' if not problems else f'{len(problems)} problem(s) found')
    if args.routes and not problems:
        import torch
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        print('\n'.join(route_report(device)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
