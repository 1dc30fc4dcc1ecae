# The segmentation stack on the GPU machine: mmcv 2.1.0 built from its carried sdist with CPU ops
# only, mmsegmentation & co. from the carried wheels in .whl/seg (bash tools/gpu/prepare.sh fills
# both). Sourced, never run, by tools/gpu/multigpu.sh and tools/gpu/run.sh (step bench-dense), so
# that both install it the same way. From the repo root, with ROOT (the repo root), SITE (the
# `pip --target` folder the other packages are in) and OUT (built wheels are copied to
# $OUT/built) set:
#
#   seg_stack_check || exit 2       # the carried files are there (else says what is missing)
#   seg_stack_pkgres                # sets PKGRES where the image's setuptools lacks pkg_resources
#   seg_stack_build_mmcv BUILD_LOG  # leaves an mmcv wheel in $SEG_MMCV_DIST (or finds one
#                                   # installed, or in .whl/built); may run in the background
#   seg_stack_install               # after every other `pip --target $SITE` install (never at
#                                   # the same time); exports PYTHONPATH
#   seg_stack_distutils             # mmengine's Runner imports distutils (Python 3.12 has none)
#
# Messages go through the caller's `say` when it defines one, else to stdout.

SEG_B=$ROOT/.gpu_build
SEG_MMCV_DIST=$SEG_B/dist_mmcv
PKGRES=${PKGRES:-}

_seg_say() { if declare -F say >/dev/null; then say "$@"; else echo "[seg-stack] $*"; fi; }

seg_stack_check() {
  local f
  for f in .whl/mmengine-0.10.7-py3-none-any.whl .whl/seg/mmsegmentation-1.2.2-py3-none-any.whl \
           .whl/seg/mmcv-2.1.0.tar.gz; do
    [ -f "$f" ] || { _seg_say "missing $f: run 'bash tools/gpu/prepare.sh' on the CPU machine" \
                              "and carry .whl"; return 2; }
  done
}

# mmengine 0.10.7 (Config.fromfile with `mmseg::` bases) and mmcv's setup.py need pkg_resources,
# which setuptools >= 82 dropped: then use the carried setuptools 80.9.
seg_stack_pkgres() {
  python3 -c 'import pkg_resources' >/dev/null 2>&1 && return 0
  PKGRES=$SEG_B/site_setuptools
  [ -f "$PKGRES/pkg_resources/__init__.py" ] || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --target "$PKGRES" .whl/seg/setuptools/setuptools-*.whl
  _seg_say "python3's setuptools ($(python3 -c 'import setuptools; print(setuptools.__version__)' \
      2>/dev/null)) has no pkg_resources: using the carried one from $PKGRES"
}

seg_stack_build_mmcv() {  # BUILD_LOG; leaves mmcv-2.1.0-*.whl in $SEG_MMCV_DIST (or nothing to do)
  local log=$1 src=$SEG_B/src/mmcv-2.1.0 inc t0
  if ls "$SITE"/mmcv/_ext*.so >/dev/null 2>&1 && [ -d "$SITE/mmcv-2.1.0.dist-info" ]; then
    echo "mmcv 2.1.0 with ops already installed in $SITE"; return 0
  fi
  rm -rf "$SEG_MMCV_DIST" && mkdir -p "$SEG_MMCV_DIST"
  if ls .whl/built/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    cp .whl/built/mmcv-2.1.0-*.whl "$SEG_MMCV_DIST/" && echo "mmcv: wheel from .whl/built" \
      && return 0
  fi
  rm -rf "$src" && mkdir -p "$SEG_B/src" && tar xzf .whl/seg/mmcv-2.1.0.tar.gz -C "$SEG_B/src"
  # mmcv 2.1.0 compiles with -std=c++17; torch >= 2.14's ATen.h demands C++20 (see
  # tools/setup_env.sh): switch only when the installed headers say so.
  inc=$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
  if grep -qs 'C++20 or later compatible compiler is required' "$inc/ATen/ATen.h"; then
    sed -i 's/-std=c++17/-std=c++20/g' "$src/setup.py"; echo "mmcv: setup.py set to -std=c++20"
  else
    echo "mmcv: keeping -std=c++17 (enough for torch" \
         "$(python3 -c 'import torch; print(torch.__version__)'))"
  fi
  t0=$(date +%s)
  # CPU ops only: mmcv's setup.py builds the CUDA ops whenever torch sees a GPU, whatever
  # FORCE_CUDA says, so the GPUs are hidden from this build.
  (cd "$src" && env CUDA_VISIBLE_DEVICES= MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="$(nproc)" \
      CFLAGS=-g0 CXXFLAGS=-g0 PYTHONPATH="$PKGRES" python3 -m pip wheel -q --no-deps \
      --no-build-isolation --no-cache-dir -w "$SEG_MMCV_DIST" .) > "$log" 2>&1 \
    || { tail -30 "$log"; echo "mmcv build failed"; return 1; }
  mkdir -p "$OUT/built" && cp "$SEG_MMCV_DIST"/mmcv-2.1.0-*.whl "$OUT/built/"
  echo "mmcv built in $(( $(date +%s) - t0 )) s"
}

seg_stack_install() {
  local inst=(.whl/seg/*.whl)
  ls "$SEG_MMCV_DIST"/mmcv-2.1.0-*.whl >/dev/null 2>&1 && inst+=("$SEG_MMCV_DIST"/mmcv-2.1.0-*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${inst[@]}" || { _seg_say "installing ${inst[*]} failed"; return 3; }
  rm -rf "$SEG_MMCV_DIST"
  # the mmsegmentation wheel ships a top-level `tests` package, which would shadow ours
  rm -rf "$SITE/tests"
  export PYTHONPATH=${PKGRES:+$PKGRES:}$SITE:$ROOT
}

# Python 3.12 has no distutils; mmengine's collect_env (at every Runner start) imports it and
# normally gets setuptools' copy through setuptools' .pth hook. Without it: the same hook from a
# sitecustomize on the path.
seg_stack_distutils() {
  python3 -c 'from distutils import errors' >/dev/null 2>&1 && return 0
  mkdir -p "$SEG_B/site_compat"
  printf '%s\n' 'try:' '    import _distutils_hack' '    _distutils_hack.add_shim()' \
    'except Exception:' '    pass' > "$SEG_B/site_compat/sitecustomize.py"
  export PYTHONPATH=$SEG_B/site_compat:$PYTHONPATH
  if python3 -c 'from distutils import errors' >/dev/null 2>&1; then
    _seg_say "distutils: setuptools' shim"
  else
    _seg_say "WARNING: no distutils module: mmengine's Runner (collect_env) will fail"
  fi
}
