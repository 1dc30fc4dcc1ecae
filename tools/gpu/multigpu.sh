#!/usr/bin/env bash
# Data-parallel segmentation training through mmengine, with a checkpoint resume, in one call.
#
# On the 2-GPU machine (device tool, kind nvidia-h200-x2, carry [".whl"]; fill .whl first with
# `bash tools/gpu/prepare.sh` on the CPU machine):
#   bash tools/gpu/multigpu.sh
# Here, on the CPU (same steps and config overrides, one process, 64x64 crops, 4 + 2 iterations;
# no install, no build; uses .venv):
#   MG_CPU_SMOKE=1 bash tools/gpu/multigpu.sh
#
# Steps (GPU): `tools/gpu/run.sh build` (carried wheels into .gpu_build/site, mamba-ssm and
# causal-conv1d for this GPU) and, in parallel, mmcv 2.1.0 from its sdist with CPU ops only; then
# mmsegmentation & co. from .whl/seg (both through tools/gpu/seg_stack.sh, which run.sh's
# bench-dense step uses too); a tiny ADE20K-format dataset (amvim_mm.testing.make_ade20k);
# run 1: torchrun (python3 -m torch.distributed.run) --nproc_per_node N tools/train.py on the
# Vim-T UperNet ADE20K config, 200 iterations, checkpoints every 100; run 2: --resume from
# iter_200.pth up to 300. tools/gpu/summarize_multigpu.py then writes $OUT/multigpu.json and
# $OUT/multigpu.md. Also in $OUT: multigpu_train.log (both runs' mmengine logs),
# multigpu_logs.tar.gz (all logs, scalars, configs, build logs; no checkpoints) and built/ (wheels
# built in this call: carried back in .whl/built/ they are installed instead of built again).
# At most 7 files, since the device tool brings back 8.
#
# Mixer paths: runs 1 and 2 train on the fused path (AMVIM_FUSED_MIXER=1: the Triton kernels
# with their backward, amvim_mm/ops/fused_mixer_autograd.py), run 3 (MG_COMPARE_ITERS, 60) on
# the unfused path (AMVIM_FUSED_MIXER=0: mamba-ssm / causal-conv1d) from the same start, for
# s/iter side by side; the path each run took is asked of the model with the run's settings
# (MG_FUSED=0 trains runs 1-2 unfused too; the CPU smoke test's default, the fused path there
# being Triton's interpreter). MG_AMP (bf16 on the GPU, none in the CPU smoke
# test) switches the config's fp32 OptimWrapper to an AmpOptimWrapper of that dtype.
# Overrides (env): MG_NGPU (default: all GPUs), MG_CROP (256), MG_BATCH (4 per GPU), MG_ITERS
# (200), MG_RESUME_ITERS (300), MG_CKPT_INTERVAL (100), MG_LOG_INTERVAL (10), MG_WARMUP (20),
# MG_LR (the config's 6e-5), MG_NTRAIN/MG_NVAL (64/8 images of MG_IMG=128 px), MG_CONFIG,
# MG_BUDGET_S (540: the trainings are cut to end by then, counted from the start).
set -uo pipefail
# NVLink multicast stays off for every child process (KINDS.md): NCCL, PyTorch, NVSHMEM
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
B=$ROOT/.gpu_build
OUT=${OUT:-$B/out_multigpu}
SITE=$B/site
LOGS=$B/multigpu_logs
WORK=$B/work_dirs/multigpu
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
exec > >(tee -a "$LOGS/console.log") 2>&1
T0=$(date +%s)
DEADLINE=$(( T0 + ${MG_BUDGET_S:-540} ))
say() { echo "[multigpu $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }

SMOKE=${MG_CPU_SMOKE:-0}
CONFIG=${MG_CONFIG:-configs/vim/vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py}
if [ "$SMOKE" = 1 ]; then
  PY=${MG_PY:-$ROOT/.venv/bin/python}
  CROP=${MG_CROP:-64} BATCH=${MG_BATCH:-2} ITERS=${MG_ITERS:-4} ITERS2=${MG_RESUME_ITERS:-6}
  CKPT=${MG_CKPT_INTERVAL:-2} LOGI=${MG_LOG_INTERVAL:-2} WARMUP=${MG_WARMUP:-2}
  NTRAIN=${MG_NTRAIN:-16} NVAL=${MG_NVAL:-4} WINDOW=${MG_LOSS_WINDOW:-2}
  CMP_ITERS=${MG_COMPARE_ITERS:-2} AMP=${MG_AMP:-none} FUSED=${MG_FUSED:-0}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
else
  PY=python3
  CROP=${MG_CROP:-256} BATCH=${MG_BATCH:-4} ITERS=${MG_ITERS:-200} ITERS2=${MG_RESUME_ITERS:-300}
  CKPT=${MG_CKPT_INTERVAL:-100} LOGI=${MG_LOG_INTERVAL:-10} WARMUP=${MG_WARMUP:-20}
  NTRAIN=${MG_NTRAIN:-64} NVAL=${MG_NVAL:-8} WINDOW=${MG_LOSS_WINDOW:-20}
  CMP_ITERS=${MG_COMPARE_ITERS:-60} AMP=${MG_AMP:-bf16}
fi
FUSED=${FUSED:-${MG_FUSED:-1}}
IMG=${MG_IMG:-128}
DATA=$B/data/ade_tiny_${NTRAIN}_${NVAL}_${IMG}
say "mode: $([ "$SMOKE" = 1 ] && echo 'CPU smoke test' || echo GPU), config $CONFIG, crop $CROP," \
    "batch/GPU $BATCH, iterations $ITERS then resume to $ITERS2"

# ------------------------------------------------------------------------------------------
# 1. installs and builds (GPU mode only)
# ------------------------------------------------------------------------------------------
PKGRES=""
if [ "$SMOKE" = 1 ]; then
  NGPU=1
  GPUS="cpu"
  # MG_PYTHONPATH_PREFIX: e.g. the carried wheels installed with pip --target, to try them here
  export PYTHONPATH=${MG_PYTHONPATH_PREFIX:+$MG_PYTHONPATH_PREFIX:}$ROOT
else
  # the segmentation stack's install, shared with run.sh's bench-dense step
  source tools/gpu/seg_stack.sh
  seg_stack_check || exit 2
  GPUS=$(nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader)
  echo "$GPUS" | tee "$LOGS/gpus.txt"
  NGPU=${MG_NGPU:-$(echo "$GPUS" | grep -c .)}
  [ "$NGPU" -ge 2 ] || say "WARNING: $NGPU GPU(s): this is not a multi-GPU run"
  say "$(nproc) CPU cores; $NGPU processes (one per GPU)"
  seg_stack_pkgres

  say "building: tools/gpu/run.sh build (mamba-ssm, causal-conv1d) and mmcv 2.1.0, in parallel"
  rm -rf "$B/out_runsh"
  OUT=$B/out_runsh bash tools/gpu/run.sh build > "$LOGS/runsh_build.log" 2>&1 &
  runsh_pid=$!
  seg_stack_build_mmcv "$LOGS/mmcv_build.log" > "$LOGS/mmcv.log" 2>&1 &
  mmcv_pid=$!
  wait $mmcv_pid; mmcv_rc=$?
  say "mmcv: $(tail -1 "$LOGS/mmcv.log") (rc $mmcv_rc)"
  wait $runsh_pid; runsh_rc=$?
  say "run.sh build (rc $runsh_rc): $(grep -E 'built in|installed from|failed' \
      "$LOGS/runsh_build.log" | tr '\n' ';')"
  [ $runsh_rc -eq 0 ] || { tail -20 "$LOGS/runsh_build.log"
    say "WARNING: mamba-ssm build failed: the scan runs on the (slow) torch backend"; }
  if ls "$B/out_runsh/built"/*.whl >/dev/null 2>&1; then
    mkdir -p "$OUT/built" && cp "$B/out_runsh/built"/*.whl "$OUT/built/"
  fi
  [ $mmcv_rc -eq 0 ] || { cat "$LOGS/mmcv.log"; say "mmcv unavailable: stopping"; exit 3; }

  # after run.sh's installs (both use pip --target on the same folder: never at once)
  seg_stack_install || exit 3
  seg_stack_distutils
fi

# MG_THEN: run this command with the segmentation stack installed (e.g. an evaluation on one
# GPU) instead of the training runs, and exit with its status
if [ -n "${MG_THEN:-}" ]; then
  say "MG_THEN: $MG_THEN"
  bash -c "$MG_THEN"; rc=$?
  say "MG_THEN exit $rc"; exit $rc
fi

"$PY" - > "$LOGS/versions.json" 2> "$LOGS/versions.err" <<'PY'
import json, warnings
warnings.filterwarnings('ignore')
import torch, mmengine, mmcv, mmseg
import mmcv.ops  # noqa: F401  (compiled ops: mmseg imports them)
import amvim_mm  # noqa: F401
from amvim_mm.bench.environment import collect_env
info, _ = collect_env()
info.update(mmcv_file=mmcv.__file__, mmseg_file=mmseg.__file__)
print(json.dumps(info))
PY
[ $? -eq 0 ] || { cat "$LOGS/versions.err"; say "the training stack does not import: stopping"; exit 3; }
say "stack: $(cat "$LOGS/versions.json")"

# ------------------------------------------------------------------------------------------
# 2. data and config overrides
# ------------------------------------------------------------------------------------------
if [ ! -f "$DATA/.done" ]; then
  rm -rf "$DATA"
  "$PY" -c "from amvim_mm.testing import make_ade20k; make_ade20k('$DATA', num_train=$NTRAIN, \
num_val=$NVAL, size=($IMG, $IMG), seed=0)" && touch "$DATA/.done" || { say "dataset failed"; exit 3; }
fi
say "dataset: $DATA ($NTRAIN train / $NVAL val images, ${IMG}x$IMG)"

STRIDE=$(( CROP * 2 / 3 ))   # the config's 341 for 512
OPTS=(
  "train_dataloader.dataset.data_root=$DATA"
  "val_dataloader.dataset.data_root=$DATA"
  "test_dataloader.dataset.data_root=$DATA"
  "train_dataloader.batch_size=$BATCH"
  "train_dataloader.dataset.pipeline.2.scale=($(( 4 * CROP )),$CROP)"
  "train_dataloader.dataset.pipeline.3.crop_size=($CROP,$CROP)"
  "val_dataloader.dataset.pipeline.1.scale=($(( 4 * CROP )),$CROP)"
  "test_dataloader.dataset.pipeline.1.scale=($(( 4 * CROP )),$CROP)"
  "model.data_preprocessor.size=($CROP,$CROP)"
  "model.test_cfg.crop_size=($CROP,$CROP)"
  "model.test_cfg.stride=($STRIDE,$STRIDE)"
  "model.backbone.img_size=$CROP"
  "model.backbone.init_cfg=None"
  "train_cfg.val_interval=$ITERS"
  "default_hooks.checkpoint.interval=$CKPT"
  "default_hooks.logger.interval=$LOGI"
  "param_scheduler.0.end=$WARMUP"
  "param_scheduler.1.begin=$WARMUP"
  "randomness.seed=0"
)
# from scratch for a few hundred iterations: 10x the config's fine-tuning rate (6e-5)
[ "$SMOKE" = 1 ] || MG_LR=${MG_LR:-6e-4}
[ -n "${MG_LR:-}" ] && OPTS+=("optim_wrapper.optimizer.lr=$MG_LR")
case "$AMP" in
  none) ;;
  bf16|fp16) OPTS+=("optim_wrapper.type=AmpOptimWrapper"
                    "optim_wrapper.dtype=$([ "$AMP" = bf16 ] && echo bfloat16 || echo float16)") ;;
  *) say "MG_AMP=$AMP: use bf16, fp16 or none"; exit 2 ;;
esac

# the list-index overrides above must hit the transforms they mean: check before launching
"$PY" - "$CONFIG" "$LOGS/config_run1.py" "${OPTS[@]}" "train_cfg.max_iters=$ITERS" \
  > "$LOGS/config_check.log" 2>&1 <<'PY'
import sys, warnings
warnings.filterwarnings('ignore')
from mmengine.config import Config, DictAction
import argparse
p = argparse.ArgumentParser()
p.add_argument('opts', nargs='+', action=DictAction)
cfg = Config.fromfile(sys.argv[1])
cfg.merge_from_dict(p.parse_args(sys.argv[3:]).opts)
tp = cfg.train_dataloader.dataset.pipeline
vp = cfg.val_dataloader.dataset.pipeline
sp = cfg.test_dataloader.dataset.pipeline
assert [tp[2].type, tp[3].type, vp[1].type, sp[1].type] == \
    ['RandomResize', 'RandomCrop', 'Resize', 'Resize'], (tp, vp, sp)
bb = cfg.model.backbone
assert bb.init_cfg is None and cfg.model.get('pretrained') is None and cfg.get('load_from') is None
print('train pipeline:', [t.type for t in tp], 'crop', tp[3].crop_size, 'scale', tp[2].scale)
print('backbone:', dict(bb), 'norm:', cfg.model.decode_head.norm_cfg)
cfg.dump(sys.argv[2])
PY
[ $? -eq 0 ] || { cat "$LOGS/config_check.log"; say "config overrides do not fit $CONFIG"; exit 3; }
say "config overrides checked ($(tail -1 "$LOGS/config_check.log" | cut -c1-150))"

# ------------------------------------------------------------------------------------------
# 3. the two training runs
# ------------------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  LAUNCH=("$PY" tools/train.py); LAUNCHER=none
else
  LAUNCH=(python3 -m torch.distributed.run --standalone --nproc_per_node "$NGPU" tools/train.py)
  LAUNCHER=pytorch
fi
CMD1=("${LAUNCH[@]}" "$CONFIG" --launcher "$LAUNCHER" --work-dir "$WORK"
      --cfg-options "${OPTS[@]}" "train_cfg.max_iters=$ITERS")
CMD2=("${LAUNCH[@]}" "$CONFIG" --launcher "$LAUNCHER" --work-dir "$WORK"
      --resume "$WORK/iter_$ITERS.pth" --cfg-options "${OPTS[@]}" "train_cfg.max_iters=$ITERS2")
WORK_CMP=${WORK}_unfused
CMD3=("${LAUNCH[@]}" "$CONFIG" --launcher "$LAUNCHER" --work-dir "$WORK_CMP"
      --cfg-options "${OPTS[@]}" "train_cfg.max_iters=$CMP_ITERS"
      "default_hooks.checkpoint.interval=$(( CMP_ITERS + 1 ))" "train_cfg.val_interval=$(( CMP_ITERS + 1 ))")
ENVSTR="PYTHONPATH=$PYTHONPATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
{ printf 'cd %q && %s AMVIM_FUSED_MIXER=%s ' "$ROOT" "$ENVSTR" "$FUSED"; printf '%q ' "${CMD1[@]}"; echo
  printf 'cd %q && %s AMVIM_FUSED_MIXER=%s ' "$ROOT" "$ENVSTR" "$FUSED"; printf '%q ' "${CMD2[@]}"; echo
  printf 'cd %q && %s AMVIM_FUSED_MIXER=0 ' "$ROOT" "$ENVSTR"; printf '%q ' "${CMD3[@]}"; echo
} > "$LOGS/commands.txt"

# the mixer path a training step of the config's model takes with AMVIM_FUSED_MIXER=$1, asked
# of the model as the forward asks (on the device the runs use, under the runs' autocast)
path_of() {
  AMVIM_FUSED_MIXER=$1 "$PY" - "$LOGS/config_run1.py" "$AMP" "$SMOKE" <<'PY' 2>>"$LOGS/path_probe.err"
import sys, warnings
warnings.filterwarnings('ignore')
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
import amvim_mm  # noqa: F401
from amvim_mm.registry import MODELS
cfg = Config.fromfile(sys.argv[1])
init_default_scope('mmseg')
bb = dict(cfg.model.backbone)
dev = 'cpu' if sys.argv[3] == '1' else 'cuda'
m = MODELS.build(bb).to(dev).train()
s = bb.get('img_size', 224)
x = torch.zeros(1, 3, s, s, device=dev)
amp = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(sys.argv[2])
try:
    with torch.autocast(dev, dtype=amp or torch.float32, enabled=amp is not None):
        print('fused' if m.fused_path(x) else 'unfused')
except Exception as e:   # e.g. the fused path forced on a CPU without Triton's interpreter
    print(f'error: {type(e).__name__}: {str(e).splitlines()[0][:120]}')
PY
}

run_train() {  # NAME CAP_S CMD...: runs CMD under a time limit, log in $LOGS/NAME.log
  local name=$1 cap=$2 left lim rc t0; shift 2
  left=$(( DEADLINE - $(date +%s) ))
  lim=$(( left < cap ? left : cap ))
  if [ "$lim" -lt 30 ]; then say "$name: skipped, only ${left}s of the budget left"; return 124; fi
  say "$name: start (time limit ${lim}s)"
  t0=$(date +%s)
  timeout -k 15 "$lim" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  # compact progress: iteration, time per iteration, loss; validation; resume; checkpoints
  grep -E 'Iter\(train\)|Iter\(val\) \[[0-9]+/[0-9]+\] +aAcc|resumed epoch|Saving checkpoint' \
    "$LOGS/$name.log" | sed -E \
    -e 's/^.*(Iter\(train\) \[ *[0-9]+\/[0-9]+\]).* time: ([0-9.]+) .* memory: ([0-9]+) +loss: ([0-9.]+).*$/  \1 s\/it \2 mem \3MB loss \4/;t' \
    -e 's/^.*(Iter\(train\) \[ *[0-9]+\/[0-9]+\]).* time: ([0-9.]+) .* loss: ([0-9.]+).*$/  \1 s\/it \2 loss \3/;t' \
    -e 's/^.*(Iter\(val\).*)$/  \1/;t' -e 's/^.* - mmengine - INFO - /  /'
  say "$name: exit $rc after $(( $(date +%s) - t0 )) s"
  if [ $rc -ne 0 ]; then
    grep -nE 'Traceback|Error' "$LOGS/$name.log" | head -5
    tail -40 "$LOGS/$name.log"
  fi
  return $rc
}

rm -rf "$WORK" "$WORK_CMP"
PATH1=$(path_of "$FUSED"); PATH3=$(path_of 0)
say "mixer path: runs 1-2 (AMVIM_FUSED_MIXER=$FUSED) $PATH1; run 3 (AMVIM_FUSED_MIXER=0) $PATH3"
TR0=$(date +%s)
AMVIM_FUSED_MIXER=$FUSED run_train run1_train "${MG_RUN1_CAP_S:-260}" "${CMD1[@]}"; rc1=$?
rc2=125
if [ -f "$WORK/iter_$ITERS.pth" ]; then
  AMVIM_FUSED_MIXER=$FUSED run_train run2_resume "${MG_RUN2_CAP_S:-200}" "${CMD2[@]}"; rc2=$?
else
  say "no $WORK/iter_$ITERS.pth: the resume run is skipped"
fi
AMVIM_FUSED_MIXER=0 run_train run3_unfused "${MG_RUN3_CAP_S:-120}" "${CMD3[@]}"; rc3=$?

# ------------------------------------------------------------------------------------------
# 4. summary and logs
# ------------------------------------------------------------------------------------------
MG_GPUS=$GPUS MG_MODE=$([ "$SMOKE" = 1 ] && echo "CPU smoke test, 1 process" \
  || echo "$NGPU-GPU DDP (torchrun, mmengine launcher pytorch)") MG_WALL=$(( $(date +%s) - T0 )) \
MG_TRAIN_WALL=$(( $(date +%s) - TR0 )) MG_CFG=$CONFIG MG_N=$NGPU MG_B=$BATCH MG_I1=$ITERS \
MG_I2=$ITERS2 MG_CK=$CKPT MG_W=$WINDOW MG_CROPSZ=$CROP MG_DATA="$NTRAIN train / $NVAL val, ${IMG}x$IMG" \
MG_RC="$rc1 $rc2 $rc3" MG_SMOKE=$SMOKE MG_PATHS="$PATH1|$PATH3" MG_AMPDT=$AMP \
"$PY" - "$LOGS/commands.txt" "$LOGS/versions.json" > "$LOGS/meta.json" <<'PY'
import json, os, sys
e = os.environ
gpus = [g.strip() for g in e['MG_GPUS'].splitlines() if g.strip()]
try:
    versions = json.load(open(sys.argv[2]))
except Exception:
    versions = None
print(json.dumps(dict(
    mode=e['MG_MODE'], config=e['MG_CFG'], world_size=int(e['MG_N']), gpus=gpus,
    per_gpu_batch=int(e['MG_B']), max_iters=int(e['MG_I1']), resume_max_iters=int(e['MG_I2']),
    checkpoint_interval=int(e['MG_CK']), loss_window=int(e['MG_W']),
    crop_size=[int(e['MG_CROPSZ'])] * 2, dataset=e['MG_DATA'], wall_s=int(e['MG_WALL']),
    train_wall_s=int(e['MG_TRAIN_WALL']), require_loss_decrease=e['MG_SMOKE'] != '1',
    exit_codes=dict(zip(('run1', 'run2', 'run3'), e['MG_RC'].split())),
    mixer_path=dict(zip(('run1_run2', 'run3'), e['MG_PATHS'].split('|'))), amp=e['MG_AMPDT'],
    commands=open(sys.argv[1]).read().splitlines(), versions=versions), indent=1))
PY
"$PY" tools/gpu/summarize_multigpu.py --work-dir "$WORK" --out-dir "$OUT" --meta "$LOGS/meta.json" \
  --compare-work-dir "$WORK_CMP"
src=$?
for d in $(ls -d "$WORK"/[0-9]*_[0-9]* 2>/dev/null); do
  echo "===== $(basename "$d") =====" && cat "$d/$(basename "$d").log"
done > "$OUT/multigpu_train.log"
ls -la "$WORK" > "$LOGS/work_dir_listing.txt" 2>&1
say "done: summary exit $src, runs exit $rc1 / $rc2 / $rc3; wall $(( $(date +%s) - T0 )) s"
tar czf "$OUT/multigpu_logs.tar.gz" --exclude='*.pth' --exclude='*.whl' -C "$B" multigpu_logs \
  $( [ -d "$B/out_runsh" ] && echo out_runsh ) work_dirs/multigpu work_dirs/multigpu_unfused \
  2>/dev/null
ls -la "$OUT" "$OUT/built" 2>/dev/null
exit $src
