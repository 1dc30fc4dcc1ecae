#!/usr/bin/env bash
# Create (if missing) and verify the project's virtual environment in .venv.
#
# Steps, each skipped when already done:
#   1. python3.11 -m venv .venv
#   2. pip install the pinned set (requirements.txt, constrained by requirements/lock.txt)
#   3. mmcv 2.1.0 with its CPU ops: built once from the sdist (about 6 min on 2 cores) and the
#      wheel cached outside the repo in $AMVIM_CACHE (default ~/.cache/amvim_mm), keyed by the
#      mmcv, torch and Python versions (pip's own cache ignores the torch ABI)
#   4. pip install -e . (this project, no deps)
#   5. the compiled CPU kernels of the mixer (tools/build_cpu_ops.py: one g++ call, about 15 s,
#      cached in $AMVIM_CACHE/cpu_kernels keyed by source, torch and CPU); without a compiler
#      one line says so and the CPU scan runs in PyTorch (slower, same results)
#   6. python tools/check_env.py --quiet (fails with the fix when something is broken)
#   7. the optional extras asked for (arguments or AMVIM_EXTRAS, e.g. `deploy`:
#      requirements/deploy.txt, constrained by requirements/lock.txt), each with its own stamp
# A stamp in .venv records the hash of the install inputs; a second run only re-checks (seconds).
#
# Usage: bash tools/setup_env.sh [EXTRA ...]   (extras: deploy)
# Environment: PYTHON (interpreter for the venv, default python3.11 or python3),
#              AMVIM_CACHE (wheel cache), AMVIM_FORCE_SETUP=1 (ignore the stamps),
#              AMVIM_EXTRAS (extras to install, space- or comma-separated, e.g. deploy).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
CACHE="${AMVIM_CACHE:-$HOME/.cache/amvim_mm}"
MMCV_VERSION=2.1.0
STEP="start"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
fail() {
  say "FAILED at step: $STEP"
  say "$1"
  exit 1
}
trap 'rc=$?; if [ $rc -ne 0 ] && [ "$STEP" != done ]; then say "FAILED at step: $STEP (exit $rc). Fix the error above and re-run: bash tools/setup_env.sh (AMVIM_FORCE_SETUP=1 to redo every step)."; fi' EXIT

inputs_hash() {
  local f
  for f in requirements.txt requirements/lock.txt tools/setup_env.sh setup.cfg pyproject.toml \
           amvim_mm/ops/csrc/*.cpp; do
    [ -f "$f" ] && cat "$f"
  done | sha256sum | cut -c1-16
}

KNOWN_EXTRAS="deploy"
EXTRAS="$(echo "${AMVIM_EXTRAS:-} $*" | tr ',' ' ' | xargs -n1 2>/dev/null | sort -u | xargs)"
for extra in $EXTRAS; do
  case " $KNOWN_EXTRAS " in
    *" $extra "*) ;;
    *) fail "unknown extra '$extra' (known: $KNOWN_EXTRAS)" ;;
  esac
done

# The extras (requirements/<extra>.txt) with the lock as constraint, each stamped in .venv by
# the hash of its file and the lock: a second run with the same extras costs nothing.
install_extras() {
  local extra file stamp want
  for extra in $EXTRAS; do
    file="requirements/$extra.txt"
    stamp="$VENV/.amvim_extra_${extra}_stamp"
    want="$(cat "$file" requirements/lock.txt tools/setup_env.sh | sha256sum | cut -c1-16)"
    if [ -z "${AMVIM_FORCE_SETUP:-}" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      continue
    fi
    STEP="extra $extra"
    say "extras: installing $extra ($file)"
    "$VENV/bin/python" -m pip --disable-pip-version-check install --progress-bar off \
        -r "$file" -c requirements/lock.txt \
      || fail "pip could not install $file; see pip's message above."
    echo "$want" > "$stamp"
  done
}

STEP="python"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if command -v python3.11 >/dev/null; then PY=python3.11; else PY=python3; fi
fi
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null \
  || fail "Python 3.11 is required (found: $("$PY" --version 2>&1)). Set PYTHON=/path/to/python3.11."

STAMP="$VENV/.amvim_setup_stamp"
WANT="$(inputs_hash)"
if [ -z "${AMVIM_FORCE_SETUP:-}" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  STEP="check"
  if "$VENV/bin/python" tools/check_env.py --quiet; then
    install_extras
    STEP="done"
    say "environment up to date (.venv)"
    exit 0
  fi
  say "environment check failed; re-running the install steps"
fi

STEP="venv"
if [ ! -x "$VENV/bin/python" ]; then
  say "1/6 creating virtual environment .venv ($("$PY" --version))"
  "$PY" -m venv "$VENV"
else
  say "1/6 virtual environment .venv exists"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

STEP="requirements"
say "2/6 installing the pinned requirements (first run: torch is large, a few minutes)"
CONSTRAINT=()
[ -f requirements/lock.txt ] && CONSTRAINT=(-c requirements/lock.txt)
"${PIP[@]}" install --progress-bar off "setuptools>=77.0.3,<81" wheel "${CONSTRAINT[@]}" \
  || fail "pip could not install setuptools/wheel; check network access to PyPI."
"${PIP[@]}" install --progress-bar off -r requirements.txt "${CONSTRAINT[@]}" \
  || fail "pip could not install requirements.txt; see pip's message above."

STEP="mmcv"
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
PYTAG="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
WHEEL_DIR="$CACHE/wheels/mmcv-${MMCV_VERSION}_torch-${TORCH_VERSION}_${PYTAG}"
have_mmcv() {
  "$VENV/bin/python" - <<EOF 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version('mmcv') == '$MMCV_VERSION' else 1)
EOF
}
if have_mmcv && "$VENV/bin/python" -c 'import mmcv.ops; mmcv.ops.nms' 2>/dev/null; then
  say "3/6 mmcv $MMCV_VERSION with ops already installed"
else
  if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
    say "3/6 building mmcv $MMCV_VERSION with CPU ops from the sdist for torch $TORCH_VERSION (about 6 min on 2 cores, once; cached in $WHEEL_DIR)"
    BUILD="$(mktemp -d)"
    ( cd "$BUILD"
      # pip runs setup.py even to download the sdist, and it imports torch: no build isolation.
      "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d . \
        || fail "could not download the mmcv $MMCV_VERSION sdist from PyPI."
      tar xzf mmcv-"$MMCV_VERSION".tar.gz
      cd mmcv-"$MMCV_VERSION"
      # mmcv 2.1.0's setup.py hard-codes -std=c++17; ATen of torch >= 2.14 requires C++20
      # ("C++20 or later compatible compiler is required to use ATen"). No env variable can
      # override it, so the flag is changed in this unpacked copy of the sdist (never in an
      # installed package). Fixed upstream in mmcv >= 2.2 (which mmseg 1.2.2 / mmdet 3.3.0 reject).
      sed -i 's/-std=c++17/-std=c++20/g' setup.py
      MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CFLAGS=-g0 CXXFLAGS=-g0 \
        "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -w "$BUILD/dist" . \
        || fail "building mmcv failed; a C++ compiler (g++) and the Python headers are needed."
    )
    mkdir -p "$WHEEL_DIR"
    cp "$BUILD"/dist/mmcv-*.whl "$WHEEL_DIR"/
    rm -rf "$BUILD"
  else
    say "3/6 using the cached mmcv wheel in $WHEEL_DIR"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$WHEEL_DIR"/mmcv-*.whl \
    || fail "could not install the cached mmcv wheel; delete $WHEEL_DIR and re-run."
fi

STEP="project"
say "4/6 installing amvim_mm in editable mode"
"${PIP[@]}" install --no-deps --no-build-isolation -e . >/dev/null \
  || fail "pip install -e . failed; see the message above."

STEP="cpu kernels"
say "5/6 the compiled CPU kernels (built once, about 15 s)"
"$VENV/bin/python" tools/build_cpu_ops.py >/dev/null \
  || say "continuing without the compiled CPU kernels (see the line above)"

STEP="check"
say "6/6 checking the environment"
"$VENV/bin/python" tools/check_env.py --quiet \
  || fail "the environment check failed; its message above says what to fix."
echo "$WANT" > "$STAMP"
install_extras
STEP="done"
say "environment ready (.venv)"
