#!/usr/bin/env bash
# On the CPU machine: put what the GPU machine lacks into .whl/ (git-ignored, carried by the
# device tool): pure-Python wheels of mmengine and its missing dependencies (for the GPU image's
# Python 3.12), and the mamba-ssm and causal-conv1d sdists (built there by tools/gpu/run.sh);
# for tools/gpu/multigpu.sh, in .whl/seg/: mmsegmentation, prettytable, ftfy, wcwidth, the mmcv
# sdist and a setuptools with pkg_resources.
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
# For tools/gpu/multigpu.sh (the 2-GPU segmentation run), in .whl/seg/ so that run.sh, which
# installs .whl/*.whl, keeps installing what it did: mmsegmentation as pinned in requirements.txt
# and what it needs beyond the GPU image (KINDS.md lists matplotlib, scipy, packaging, regex,
# tabulate, timm, torchvision, opencv-python-headless there): prettytable (mmseg's IoUMetric),
# ftfy (imported by `import mmseg`: mmseg/utils/tokenizer.py) and wcwidth (needed by both).
mkdir -p .whl/seg/setuptools
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d .whl/seg mmsegmentation==1.2.2 prettytable==3.18.0 wcwidth==0.9.4 ftfy==6.3.1
# mmengine 0.10.7 (Config.fromfile of `mmseg::` bases) and mmcv 2.1.0's setup.py import
# pkg_resources, which setuptools >= 82 no longer has: a setuptools < 81 wheel is carried and
# used there only when the image's setuptools lacks pkg_resources.
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl/seg/setuptools setuptools==80.9.0
# mmcv 2.1.0 (as tools/setup_env.sh): no wheel fits torch 2.11/cp312, so its sdist is carried and
# multigpu.sh builds it there with CPU ops only. pip runs its setup.py (imports torch).
[ -f .whl/seg/mmcv-2.1.0.tar.gz ] || "$PY" -m pip download -q --no-deps --no-build-isolation \
  --no-binary :all: mmcv==2.1.0 -d .whl/seg
# Optional: the official Vim code's Python files (its model and vendored mamba_ssm package, not
# its CUDA sources; nothing is built from them) from a local git clone of hustvl/Vim, into the
# git-ignored .official/Vim, carried to time the official model in the same process as ours.
if [ -n "${OFFICIAL_VIM_GIT:-}" ]; then
  grep -qx '/.official/' .git/info/exclude || echo '/.official/' >> .git/info/exclude
  rm -rf .official/Vim && mkdir -p .official/Vim
  git --git-dir "$OFFICIAL_VIM_GIT" archive HEAD vim/models_mamba.py vim/rope.py \
    mamba-1p1p1/mamba_ssm | tar x -C .official/Vim
  git --git-dir "$OFFICIAL_VIM_GIT" rev-parse HEAD > .official/Vim/COMMIT
fi
# Optional: the official VMamba model file (the repository root's single-file vmamba.py; its
# kernels are not built, the official automatic backend then uses mamba-ssm's kernel) from a
# local git clone of MzeroMiko/VMamba, into the git-ignored .official/VMamba.
if [ -n "${OFFICIAL_VMAMBA_GIT:-}" ]; then
  grep -qx '/.official/' .git/info/exclude || echo '/.official/' >> .git/info/exclude
  rm -rf .official/VMamba && mkdir -p .official/VMamba
  git --git-dir "$OFFICIAL_VMAMBA_GIT" archive HEAD vmamba.py | tar x -C .official/VMamba
  git --git-dir "$OFFICIAL_VMAMBA_GIT" rev-parse HEAD > .official/VMamba/COMMIT
fi
# Optional: the official ViL package (NX-AI/vision-lstm's vision_lstm/, pure PyTorch; einops
# comes as a wheel) from a local git clone, into the git-ignored .official/vision-lstm.
if [ -n "${OFFICIAL_VIL_GIT:-}" ]; then
  grep -qx '/.official/' .git/info/exclude || echo '/.official/' >> .git/info/exclude
  rm -rf .official/vision-lstm && mkdir -p .official/vision-lstm
  git --git-dir "$OFFICIAL_VIL_GIT" archive HEAD vision_lstm | tar x -C .official/vision-lstm
  git --git-dir "$OFFICIAL_VIL_GIT" rev-parse HEAD > .official/vision-lstm/COMMIT
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl einops==0.8.2
fi
ls -laR .whl
du -sh .whl
