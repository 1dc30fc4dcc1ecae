# The per-token segmentation head on the device (issue 54): the dense suite's ADE20K inference
# rows of Vim-T UperNet and Vim-T + Segmenter's mask head on the kept tokens, unreduced and
# reduced by ToMe / EViT / ToP at ratio 0.46, default path (backbone CUDA graphs on), one process,
# interleaved rounds, in each dtype of DTYPES (default fp32 bf16). Run from the repository root
# on the GPU machine with .whl carried (bash tools/gpu/prepare.sh); OUT as the device tool sets.
set -u
export ROOT=$PWD SITE=$PWD/.gpu_build/site PYTHONUNBUFFERED=1
mkdir -p "$SITE" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
export PYTHONPATH=$SITE:$ROOT
source tools/gpu/seg_stack.sh
seg_stack_check || exit 2
seg_stack_pkgres
seg_stack_build_mmcv "$OUT/mmcv_build.log" > /dev/null 2>&1 || { tail -20 "$OUT/mmcv_build.log"; exit 3; }
seg_stack_install
seg_stack_distutils
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
for dt in ${DTYPES:-fp32 bf16}; do
  python3 tools/benchmark.py --suite dense --out-dir "$OUT/$dt" \
    --workloads ade-backbone ade-slide ade-whole --whole-sizes 512:8 --impls auto-graphs \
    --dense-models vim vim-segmenter --methods tome evit top --ratios 0.46 --dense-dtype "$dt" \
    --repeats 7 --budget-s "${BUDGET_S:-240}" 2>&1 | grep -v -i "warn\|_bootstrap\|pkg_resources" \
    | tee "$OUT/$dt.log"
done
