"""Build the compiled CPU kernels of the mixer into the cache (``tools/setup_env.sh`` runs this).

    python tools/build_cpu_ops.py [--verbose]

Prints the library's path (a no-op when it is already built for this source, torch and CPU).
Without a working C++ compiler it says so in one line and exits 1; amvim_mm then runs the CPU
scan in PyTorch (slower, same results). ``CXX`` picks the compiler, ``AMVIM_CACHE`` the cache.
"""
import argparse
import sys

from amvim_mm.ops import cpu_ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--verbose', action='store_true', help='print the compiler command')
    args = p.parse_args(argv)
    try:
        path = cpu_ops.build(verbose=args.verbose)
    except (RuntimeError, OSError) as e:
        msg = ' '.join(str(e).split())[:600]
        print(f'error: the compiled CPU kernels were not built ({msg}); amvim_mm runs the CPU '
              'scan in PyTorch instead (slower, same results)', file=sys.stderr)
        return 1
    ok, reason = cpu_ops.available()
    if not ok:
        print(f'error: {path} was built but does not load: {reason}', file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
