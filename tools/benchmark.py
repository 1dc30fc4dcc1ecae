"""Benchmark Vim-family models: throughput, latency, peak memory; JSON + markdown results.

    python tools/benchmark.py --suite cpu [--out-dir benchmarks]
    python tools/benchmark.py --suite gpu [--out-dir DIR] [--parts main reduction resolution]
    python tools/benchmark.py --suite dense [--out-dir DIR] [--budget-s S] [--smoke]

Suites:
  cpu: batch-1 latency at 224 on this machine's cores: timm DeiT-T / DeiT-S, Vim-T/S and
       AMVim-T on the compiled CPU kernels and on the PyTorch scan, Vim-T on the ``reference``
       loop, Vim-T with ToMe 0.17 / 0.46, and Vim-T with and without ToMe 0.46 at batch 8 (the
       batch prune_eval times a CPU at); interleaved rounds, median and spread, ratios of one
       run (amvim_mm/bench/cpu.py).
  gpu: (tune) launch configuration of the fused scan kernel; (tune-chunk) sequential against
       chunked fused scan (T = 32-256) against the mamba-ssm kernels, one mixer call per
       batch x E x L: the table of the automatic scan choice; (main) Vim-T/S and AMVim-T/S
       whole classifiers, batch 128, 224, fp32 and bf16, eager and CUDA-graph, the unfused
       mixer (mamba-ssm kernels) and the fused Triton mixer side by side, next to the official
       code (``--official-vim PATH``: timed in the same process) or its earlier anchors;
       (reduction) ToMe at ratios 0/0.17/0.27/0.36/0.46: measured speed-up against the FLOPs
       ratio; (resolution) 224 to 1024 with the batch scaled to keep pixels constant;
       (vmamba) VMamba-T whole classifier, batch 128, 224: inference fp32/bf16 eager and
       CUDA-graph and a bf16 training step, next to the official code
       (``--official-vmamba PATH``: timed in the same process, same weights, batch, dtype and
       mode), and stage-3 ToMe/ToP reduction: speed-up against the FLOPs ratio;
       (plainmamba) PlainMamba-L1/L3 classifiers; (plainmamba-reduction) L3 at the
       8.44-GFLOPs schedule of ToP-ViM: speed-up against the FLOPs ratio;
       (learned-reduction) Vim-S DynamicViT-style pruning at 3.56 GFLOPs against ToP at the
       same GFLOPs; (reduction-table) every family x reducer at its published budget in three
       modes (whole-model CUDA graph, the default eager call, eager with the backbone's graphs
       off): speed-up against the FLOPs ratio, printed as a markdown table.
  dense: the dense tasks (amvim_mm/bench/dense/): ADE20K UperNet training
       step (512, batch 8), slide and whole-image inference (512-1024), the COCO backbone +
       simple feature pyramid forward + backward (1024, batch 2) and the ImageNet fine-tuning
       step (224, batch 128), each for Vim-T and AMVim-T on the automatic (fused) and the
       unfused path next to mmseg's ViT at DeiT-T size, plus ToMe / ToP rows; the path that
       ran is recorded per row. ``--smoke`` runs every row at tiny sizes on the CPU;
       ``--budget-s`` skips the rows that no longer fit. Writes benchmark_dense.json / .md.
Every row records the command, device and versions.
"""

import argparse
import os
import os.path as osp
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.bench import dense as DB  # noqa: E402
from amvim_mm.bench.gpu import GPU_PARTS  # noqa: E402
from amvim_mm.bench.gpu.common import MIXERS  # noqa: E402
from amvim_mm.bench.gpu.tune import CHUNK_BATCHES, CHUNK_LENGTHS  # noqa: E402
from amvim_mm.bench.run import run_benchmark  # noqa: E402


def _res_batch(text: str):
    """``RES:BATCH`` -> (res, batch)."""
    try:
        res, batch = (int(v) for v in text.split(':'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected RES:BATCH, e.g. 512:8; got {text!r}')
    return res, batch


def _tune_flags(p: argparse.ArgumentParser) -> None:
    """The gpu suite's tuning parts."""
    p.add_argument('--tune-configs', nargs='+', default=[
        '32,1,1', '32,1,0', '64,2,1', '64,2,0', '16,1,1', '16,1,0'],
        help='tune part: BLOCK_E,num_warps,dt_in_kernel of the fused scan kernel')
    p.add_argument('--chunk-sizes', nargs='+', type=int, default=[32, 64, 128, 256],
                   help='tune-chunk part: chunk lengths T of the chunked fused scan')
    p.add_argument('--chunk-widths', nargs='+', type=int, default=[384, 768],
                   help='tune-chunk part: inner widths E (the mixer has D = E / 2)')
    p.add_argument('--chunk-lengths', nargs='+', type=int, default=list(CHUNK_LENGTHS),
                   help='tune-chunk part: sequence lengths L')
    p.add_argument('--chunk-batches', nargs='+', type=int, default=list(CHUNK_BATCHES),
                   help='tune-chunk part: batch sizes')
    p.add_argument('--chunk-max-tokens', type=int, default=128 * 1025,
                   help='tune-chunk part: skip shapes with batch x L above this')
    p.add_argument('--chunk-dtype', choices=['bf16', 'fp32'], default='bf16',
                   help='tune-chunk part: autocast dtype of the mixer calls')
    p.add_argument('--match-configs', nargs='+', default=[
        '32,8,1', '32,4,1', '32,16,1', '64,8,1', '64,16,1', '32,8,2', '64,16,2', '32,4,3'],
        help='tune-match part: BLOCK_D,num_warps,num_stages of the ToMe matching kernel')
    p.add_argument('--embed-configs', nargs='+', default=[
        '64,128,4,3', '64,64,4,3', '128,64,4,3', '32,128,4,3', '64,128,4,4', '64,128,8,3',
        '64,256,4,1', '128,256,8,1'],
        help='tune-embed part: BLOCK_M,BLOCK_N,num_warps,num_stages of the embedding kernel')
    p.add_argument('--bwd-configs', nargs='+', default=[
        '32,32,2', '16,32,2', '16,64,2', '16,16,1', '16,64,4'],
        help='tune-bwd part: T,BLOCK_E,num_warps of the fused scan backward')
    p.add_argument('--train-batch', type=int, default=128,
                   help='tune-bwd and train-profile parts: batch of the 224 training step')


def _gpu_flags(p: argparse.ArgumentParser) -> None:
    """The gpu suite's measuring parts."""
    p.add_argument('--train-sizes', nargs='+', type=_res_batch, default=[(224, 128)],
                   metavar='RES:BATCH', help='train part: resolutions and batches')
    p.add_argument('--train-dtypes', nargs='+', default=['bf16', 'fp32'],
                   choices=['bf16', 'fp16', 'fp32'], help='train part: autocast dtypes')
    p.add_argument('--reduction-modes', nargs='+', default=['graph'], choices=['eager', 'graph'],
                   help='reduction part: eager is launch-bound at batch 128 (many small ops)')
    p.add_argument('--reduction-variants', nargs='+', default=['default'],
                   choices=['default', 'torch-match'],
                   help="reduction part: 'torch-match' sets AMVIM_FUSED_REDUCTION_KERNELS=0 "
                        "(ToMe matching and reduced path indices in PyTorch ops)")
    p.add_argument('--mixers', nargs='+', default=['unfused', 'fused'], choices=list(MIXERS),
                   help='main part: the mixer implementations to time side by side')
    p.add_argument('--models', nargs='+', default=['vim-t', 'amvim-t', 'vim-s', 'amvim-s'])
    p.add_argument('--official-vim', metavar='PATH',
                   help='main part: a checkout of hustvl/Vim; its Vim-T/S are timed in the same '
                        'process, same weights, batch, dtype and mode (see '
                        'amvim_mm/bench/official_vim.py)')
    p.add_argument('--official-vmamba', metavar='PATH',
                   help='vmamba part: a checkout of MzeroMiko/VMamba (its root vmamba.py); '
                        'its VMamba-T is timed in the same process, same weights, batch, dtype '
                        'and mode (see amvim_mm/bench/official_vmamba.py)')
    p.add_argument('--official-vil', metavar='PATH',
                   help='vil part: a checkout of NX-AI/vision-lstm; its ViL-T is timed in the '
                        'same process, same weights, batch, dtype and mode (see '
                        'amvim_mm/bench/official_vil.py)')


def _dense_flags(p: argparse.ArgumentParser) -> None:
    """The dense suite (amvim_mm/bench/dense/)."""
    dense = p.add_argument_group('dense suite (amvim_mm/bench/dense/)')
    dense.add_argument('--smoke', action='store_true',
                       help='every row at tiny sizes on the CPU (a test of the code paths, '
                            'not a measurement)')
    dense.add_argument('--budget-s', metavar='S',
                       help='time budget in seconds from the start: rows that no longer fit '
                            'are skipped and listed')
    dense.add_argument('--workloads', nargs='+', metavar='W',
                       help=f'a subset of {", ".join(DB.WORKLOADS)} (default: all)')
    dense.add_argument('--whole-sizes', metavar='RES:BATCH,...',
                       help='whole-image inference sizes (default 512:8,768:4,1024:2)')
    dense.add_argument('--repeats', metavar='N', help='timed repeats per row (default 3)')
    dense.add_argument('--warmup', metavar='N', help='warm-up calls per row (default 3)')
    dense.add_argument('--train-iters', metavar='N',
                       help='training steps per timed repeat (default 5)')
    dense.add_argument('--infer-iters', metavar='N',
                       help='inference calls per timed repeat (default 10)')
    dense.add_argument('--impls', nargs='+', metavar='IMPL',
                       help='only these implementations\' rows (auto, unfused, forced, '
                            'auto-graphs, unfused-graphs, peer; default: all)')
    dense.add_argument('--dense-dtype', metavar='DTYPE',
                       help='bf16: every row under bf16 autocast (default); fp32: no autocast, '
                            "as mmseg's / mmdet's test tools run our configs")
    dense.add_argument('--infer-modes', nargs='+', metavar='MODE',
                       help=f'inference rows in these modes: {", ".join(DB.INFER_MODES)} '
                            '(graph: replays of one CUDA graph); default eager')
    dense.add_argument('--dense-models', nargs='+', metavar='M',
                       help=f'a subset of {", ".join(DB.MODELS)} (default: vim amvim peer; '
                            'vim-segmenter: Segmenter\'s mask head on the kept tokens, ADE20K '
                            'inference only)')
    dense.add_argument('--methods', nargs='+', metavar='METHOD',
                       help='reductions of the inference rows, prune_eval\'s names: '
                            f'{", ".join(DB.METHODS)} (default tome)')
    dense.add_argument('--ratios', nargs='+', metavar='R',
                       help='their ratios (share of tokens removed; default 0.17 0.46)')


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--suite', choices=['cpu', 'gpu', 'dense'], required=True)
    p.add_argument('--parts', nargs='+', default=['main', 'reduction', 'resolution'],
                   choices=[part for part, *_ in GPU_PARTS])
    _tune_flags(p)
    _gpu_flags(p)
    p.add_argument('--cpu-iters', type=int, default=3,
                   help='cpu suite: forwards per row and round')
    p.add_argument('--cpu-repeats', type=int, default=5,
                   help='cpu suite: interleaved rounds (median and spread over them)')
    p.add_argument('--cpu-threads', type=int, default=os.cpu_count() or 1,
                   help='cpu suite: torch.set_num_threads (default: every core)')
    p.add_argument('--cpu-rows', choices=['main', 'reduction'], default='main',
                   help='cpu suite: the peers and kernels (main) or Vim-T at batch 8 with '
                        'every reducer at its published budget (reduction)')
    p.add_argument('--out-dir', default='benchmarks')
    _dense_flags(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    command = 'python tools/benchmark.py ' + ' '.join(argv or sys.argv[1:])
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    return run_benchmark(args, command, root)


if __name__ == '__main__':
    sys.exit(run_cli(main))
