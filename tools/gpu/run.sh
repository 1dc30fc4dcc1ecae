#!/usr/bin/env bash
# On the GPU machine (the device tool, with `.whl` carried; see tools/gpu/README.md):
#   bash tools/gpu/run.sh [build] [tests] [bench] [bench-main] [bench-reduction] [bench-resolution]
#                         [bench-vmamba] [bench-vmamba-profile] [build-scan] [bench-plainmamba]
#                         [bench-plainmamba-reduction] [bench-learned-reduction] [bench-dense]
#                         [bench-reduction-table] [bench-vil]
#                         [bench-tune-bwd] [bench-train] [bench-train-profile]
#                         [bench-tune-chunk] [bench-label-map] [bench-sweep]
# (build-scan: mamba-ssm only, without causal-conv1d, which VMamba and PlainMamba do not use)
# bench-dense: the dense-task suite (python3 tools/benchmark.py --suite dense) with the
# segmentation stack of tools/gpu/seg_stack.sh (mmcv 2.1.0 built with CPU ops in parallel with
# the builds, mmsegmentation from .whl/seg); its time budget ends DENSE_DEADLINE_S (480) seconds
# after this script started (rows that no longer fit are skipped and listed); DENSE_ARGS: more
# arguments for the suite. One call: `bash tools/gpu/run.sh build-scan bench-dense`.
# Installs the carried wheels into .gpu_build/site, builds mamba-ssm for this GPU's architecture
# only (about 140 s for sm_90; reused while the machine stays warm), then runs the GPU tests and
# the benchmarks. Results and logs go to $OUT (default .gpu_build/out).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
T0=$(date +%s)
OUT=${OUT:-$ROOT/.gpu_build/out}
SITE=${SITE:-$ROOT/.gpu_build/site}
mkdir -p "$SITE" "$OUT"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(build tests bench)
# bench-reduction-compare: the reduction sweep with and without AMVIM_FUSED_REDUCTION_KERNELS=0
# bench-tune: launch configuration of the fused Triton scan kernel (the best is used afterwards)
# bench-tune-match: the same for ToMe's matching kernel
# bench-tune-embed: the same for the one-kernel embedding (patch GEMM, class token, position)
# bench-tune-bwd: launch configuration of the fused scan's backward (training)
# bench-train: training step, fused vs unfused path (batch 128, 224)
# bench-tune-chunk: sequential vs chunked fused scan (T = 32-256) vs mamba-ssm, one mixer call
#   per batch x E x L (bf16, graph and eager): the measured table of the automatic scan choice
#   (SCAN_CHOICE_TABLE, printed ready to paste); run with `build` for the mamba-ssm rows
# bench-profile: torch.profiler tables of Vim-T/AMVim-T bf16 forwards (top CUDA kernels)
# bench-label-map: mmseg's segmentation postprocess_result vs the label-map path (labels
#   checked identical; amvim_mm/bench/label_map.py) at ADE20K shape, batch 8; needs the
#   segmentation stack as bench-dense does; writes $OUT/label_map.json
# bench-sweep: prune_eval's own costs (tools/benchmark_sweep.py: one pass vs cell by cell on a
#   200-image ADE20K-shaped set, the per-stage breakdown); SWEEP_ARGS adds its options; writes
#   $OUT/sweep.json
# sweep-launcher (after bench-sweep): prune_eval under torchrun (--launcher pytorch,
#   SWEEP_NPROC processes, default 1) on the same data; checks its rows equal the sweep's
# GPU_TESTS: the test paths of `tests` (default tests/ops tests/models/test_gpu.py)
# Wheels built here are copied to $OUT/built; carried back in .whl/built/ they are installed
# instead of building again (same GPU architecture and image).
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=$SITE:$ROOT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"

# bench-dense needs mmcv + mmseg: mmcv builds (CPU ops only) while the CUDA extensions build;
# its logs stay in .gpu_build/seg_logs ($OUT brings back 8 files at most)
mmcv_pid=
SEG_LOGS=$ROOT/.gpu_build/seg_logs
if has bench-dense || has bench-label-map || has bench-sweep; then
  source tools/gpu/seg_stack.sh
  seg_stack_check || exit 2
  seg_stack_pkgres
  mkdir -p "$SEG_LOGS"
  seg_stack_build_mmcv "$SEG_LOGS/mmcv_build.log" > "$SEG_LOGS/mmcv.log" 2>&1 &
  mmcv_pid=$!
fi

build_ext() {  # build_ext SDIST_GLOB PREFIX (the package's env-var prefix) MODULE
  local glob=$1 prefix=$2 module=$3 src t0
  ls "$SITE"/${module}*.so >/dev/null 2>&1 && return 0
  if ls .whl/built/${glob}-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --no-compile --target "$SITE" .whl/built/${glob}-*.whl \
      && { echo "$glob installed from .whl/built"; return 0; }
  fi
  arch=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")')
  echo "building $glob for sm_$arch"
  rm -rf .gpu_build/src/$glob && mkdir -p .gpu_build/src
  tar xzf .whl/$glob-*.tar.gz -C .gpu_build/src
  src=$(ls -d .gpu_build/src/$glob-*/ | head -1)
  # keep only this GPU's gencode pair (CUDA 13 also rejects old sm_5x-7x entries)
  python3 - "$src/setup.py" "$arch" <<'PY'
import sys
path, arch = sys.argv[1], sys.argv[2]
s = open(path).read()
marker = '    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI'
assert marker in s, 'unexpected setup.py'
fix = (f'    cc_flag = [f for f in cc_flag if f != "-gencode" and not f.startswith("arch=")] '
       f'+ ["-gencode", "arch=compute_{arch},code=sm_{arch}"]\n')
open(path, 'w').write(s.replace(marker, fix + marker, 1))
PY
  t0=$(date +%s)
  (cd "$src" && env ${prefix}_FORCE_BUILD=TRUE MAX_JOBS=$(nproc) python3 -m pip wheel -q \
      --no-deps --no-build-isolation -w "$ROOT/.gpu_build/dist" .) > "$OUT/${glob}_build.log" 2>&1 \
    || { tail -40 "$OUT/${glob}_build.log"; echo "$glob build failed"; return 1; }
  python3 -m pip install -q --no-deps --no-compile --target "$SITE" .gpu_build/dist/${glob}-*.whl
  mkdir -p "$OUT/built" && cp .gpu_build/dist/${glob}-*.whl "$OUT/built/"
  echo "$glob built in $(( $(date +%s) - t0 )) s"
}
if has build; then
  build_ext causal_conv1d CAUSAL_CONV1D causal_conv1d_cuda &
  conv_pid=$!
  build_ext mamba_ssm MAMBA selective_scan_cuda || exit 1
  wait $conv_pid || echo "causal-conv1d build failed: the conv runs on F.conv1d"
  # mamba_ssm's package __init__ imports optional model code (transformers...): keep the ops only
  : > "$SITE/mamba_ssm/__init__.py"
elif has build-scan; then
  build_ext mamba_ssm MAMBA selective_scan_cuda || exit 1
  : > "$SITE/mamba_ssm/__init__.py"
fi
if [ -n "$mmcv_pid" ]; then
  wait $mmcv_pid; mmcv_rc=$?
  echo "mmcv: $(tail -1 "$SEG_LOGS/mmcv.log") (rc $mmcv_rc," \
       "$(( $(date +%s) - T0 )) s since start)"
  [ $mmcv_rc -eq 0 ] || { cat "$SEG_LOGS/mmcv.log"
    echo "WARNING: no mmcv: the dense suite's rows that need mmseg will record the error"; }
  # after the builds' installs (pip --target on the same folder: never at once)
  seg_stack_install && seg_stack_distutils
fi
python3 -c 'from amvim_mm.bench.environment import collect_env; i, _ = collect_env(); print(i)' | tee "$OUT/env.txt"

rc=0
if has tests; then
  python3 -m pytest -p no:cacheprovider -m gpu -rs -q ${GPU_TESTS:-tests/ops tests/models/test_gpu.py} \
    2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
parts=()
has bench && parts=(tune tune-match tune-embed main reduction resolution)
has bench-tune && parts+=(tune)
has bench-tune-chunk && parts+=(tune-chunk)
has bench-tune-match && parts+=(tune-match)
has bench-tune-embed && parts+=(tune-embed)
has bench-main && parts+=(main)
has bench-reduction && parts+=(reduction)
has bench-resolution && parts+=(resolution)
has bench-profile && parts+=(profile)
has bench-vmamba && parts+=(vmamba)
has bench-vmamba-profile && parts+=(vmamba-profile)
has bench-plainmamba && parts+=(plainmamba)
has bench-plainmamba-reduction && parts+=(plainmamba-reduction)
has bench-learned-reduction && parts+=(learned-reduction)
has bench-reduction-table && parts+=(reduction-table)
has bench-vil && parts+=(vil)
has bench-tune-bwd && parts+=(tune-bwd)
has bench-train && parts+=(train)
has bench-train-profile && parts+=(train-profile)
extra=()
# the official Vim code, timed beside ours in the main part when its files were carried
# (tools/gpu/prepare.sh with OFFICIAL_VIM_GIT; amvim_mm/bench/official_vim.py)
official=(); [ -f .official/Vim/vim/models_mamba.py ] && official=(--official-vim .official/Vim)
# the official VMamba code likewise (OFFICIAL_VMAMBA_GIT; amvim_mm/bench/official_vmamba.py)
[ -f .official/VMamba/vmamba.py ] && official+=(--official-vmamba .official/VMamba)
# the official ViL code likewise (OFFICIAL_VIL_GIT; amvim_mm/bench/official_vil.py)
[ -f .official/vision-lstm/vision_lstm/__init__.py ] && \
  official+=(--official-vil .official/vision-lstm)
has bench-reduction-compare && { parts+=(reduction); extra=(--reduction-variants default torch-match); }
if [ ${#parts[@]} -gt 0 ]; then
  python3 tools/benchmark.py --suite gpu --parts "${parts[@]}" --out-dir "$OUT" \
    --models ${BENCH_MODELS:-vim-t amvim-t vim-s amvim-s} "${extra[@]}" "${official[@]}" 2>&1 \
    | tee "$OUT/benchmark.log"
fi
if has bench-dense; then
  # the suite's budget: what is left of DENSE_DEADLINE_S, less 15 s for its imports and the
  # last write; a hard stop 90 s later (it writes its results after every row)
  left=$(( T0 + ${DENSE_DEADLINE_S:-480} - $(date +%s) - 15 ))
  [ $left -ge 20 ] || left=20
  echo "bench-dense: budget ${left} s ($(( $(date +%s) - T0 )) s since start)"
  timeout -k 10 $(( left + 90 )) python3 tools/benchmark.py --suite dense --out-dir "$OUT" \
    --budget-s "$left" ${DENSE_ARGS:-} 2>&1 | tee "$OUT/benchmark_dense.log"
  dense_rc=${PIPESTATUS[0]}
  echo "bench-dense: exit $dense_rc, $(( $(date +%s) - T0 )) s since start"
  [ $rc -ne 0 ] || rc=$dense_rc
fi
if has bench-label-map; then
  python3 -c 'import json, sys
from amvim_mm.bench.label_map import format_rows, time_postprocess
r = time_postprocess()
json.dump(r, open(sys.argv[1], "w"), indent=1)
print(format_rows(r))' "$OUT/label_map.json"
  lm_rc=$?
  echo "bench-label-map: exit $lm_rc"
  [ $rc -ne 0 ] || rc=$lm_rc
fi
if has bench-sweep; then
  python3 tools/benchmark_sweep.py --work /tmp/bench_sweep --out "$OUT/sweep.json" \
    ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/benchmark_sweep.log"
  sw_rc=${PIPESTATUS[0]}
  echo "bench-sweep: exit $sw_rc, $(( $(date +%s) - T0 )) s since start"
  [ $rc -ne 0 ] || rc=$sw_rc
fi
if has sweep-launcher; then
  # prune_eval under torchrun (--launcher pytorch, NCCL) on bench-sweep's data and random
  # checkpoint; its rows must equal the one-process sweep's (the JSON's pass metrics)
  CFG=configs/vim/vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py
  D=/tmp/bench_sweep/ade_like
  torchrun --standalone --nproc_per_node "${SWEEP_NPROC:-1}" tools/prune_eval.py "$CFG" \
    /tmp/bench_sweep/random_init.pth --names vim-t --methods tome evit --ratios 0 0.17 0.46 \
    --replicates 200 --out-dir /tmp/sweep_launcher --launcher pytorch \
    --cfg-options "val_dataloader.dataset.data_root=$D" "test_dataloader.dataset.data_root=$D" \
    > "$OUT/sweep_launcher.log" 2>&1
  sl_rc=$?
  tail -30 "$OUT/sweep_launcher.log"
  cp /tmp/sweep_launcher/results.json "$OUT/sweep_launcher_results.json" 2>/dev/null
  python3 - "$OUT/sweep.json" /tmp/sweep_launcher <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))['modes']
ref = ref.get('pass', ref.get('cell'))['metrics']
rows = json.load(open(sys.argv[2] + "/results.json"))["results"]
got = {f"{r['method']} {r['ratio']}": r['metric'] for r in rows}
same = {k: (v, ref.get(k)) for k, v in got.items()}
print('torchrun rows vs one-process sweep:', json.dumps(same))
print('SAME' if all(a == b for a, b in same.values()) else 'DIFFERENT')
PY
  echo "sweep-launcher: exit $sl_rc, $(( $(date +%s) - T0 )) s since start"
  [ $rc -ne 0 ] || rc=$sl_rc
fi
exit $rc
