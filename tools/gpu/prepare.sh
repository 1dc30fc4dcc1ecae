#!/usr/bin/env bash
# On the CPU machine: put what the GPU machine lacks into .whl/ (git-ignored, carried by the
# device tool): pure-Python wheels of mmengine and its missing dependencies (for the GPU image's
# Python 3.12), and the mamba-ssm and causal-conv1d sdists (built there by tools/gpu/run.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.gpu_build/' .git/info/exclude 2>/dev/null || echo '/.gpu_build/' >> .git/info/exclude
mkdir -p .whl
PY=.venv/bin/python
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d .whl mmengine==0.10.7 addict==2.4.0 yapf==0.43.0 termcolor==3.3.0 \
  platformdirs==4.14.8
# pip runs mamba-ssm's setup.py even to download the sdist (it imports torch): no isolation,
# and no CUDA build here.
[ -f .whl/mamba_ssm-2.3.2.post1.tar.gz ] || MAMBA_SKIP_CUDA_BUILD=TRUE "$PY" -m pip download -q \
  --no-deps --no-build-isolation --no-binary :all: mamba-ssm==2.3.2.post1 -d .whl
[ -f .whl/causal_conv1d-1.5.2.tar.gz ] || CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE "$PY" -m pip download \
  -q --no-deps --no-build-isolation --no-binary :all: causal-conv1d==1.5.2 -d .whl
ls -la .whl
