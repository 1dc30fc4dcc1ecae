set -u
export ROOT=$PWD SITE=$PWD/.gpu_build/site
mkdir -p $SITE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE .whl/*.whl
source tools/gpu/seg_stack.sh; seg_stack_pkgres; seg_stack_build_mmcv /tmp/mm.log; seg_stack_install; seg_stack_distutils
echo "PYTHONPATH=$PYTHONPATH"
python3 benchmarks/runs/2026-12-04_gpu/graph_gap.py 2>&1 | grep -v -i "warn\|_bootstrap\|pkg_resources" | tee $OUT/graph_gap.log
python3 benchmarks/runs/2026-12-04_gpu/dense_ceiling.py 5 2>&1 | grep -v -i "warn\|_bootstrap\|pkg_resources" | tee $OUT/dense_ceiling2.log
