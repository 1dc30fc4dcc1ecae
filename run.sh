#!/usr/bin/env bash
# The README's two commands:
#   bash run.sh demo   set up if needed (.venv), then run the main job
#   bash run.sh test   set up if needed (.venv) with the deploy extras (the deploy tests run),
#                      then run the test suite (extra args go to pytest)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
what="${1:-demo}"
[ $# -gt 0 ] && shift
case "$what" in
  demo) bash tools/setup_env.sh && exec .venv/bin/python tools/demo.py "$@" ;;
  # one pytest-xdist worker per core, idle ones taking tests from busy ones (the suite's tests
  # take 0.01-200 s); tests/conftest.py gives each worker its share of the threads
  test) bash tools/setup_env.sh deploy && exec .venv/bin/python -m pytest -n "$(nproc)" --dist worksteal "$@" ;;
  *) echo "usage: bash run.sh demo|test [args...]" >&2; exit 2 ;;
esac
