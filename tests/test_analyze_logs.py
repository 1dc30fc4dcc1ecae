"""The libraries' own ``tools/analysis_tools/analyze_logs.py`` run in the pinned environment.

mmseg's, mmdet's and mmpretrain's log plotters import seaborn (mmpretrain's also pandas); both
are in the pinned set for that reason. Each tool plots a training log in mmengine's
``vis_data/scalars.json`` format (one JSON object a line: training lines with ``lr`` and the
losses, validation lines with the metrics) to a PNG.
"""
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import pytest


def _tool(lib: str) -> str:
    spec = importlib.util.find_spec(lib)
    path = osp.join(osp.dirname(spec.origin), '.mim', 'tools', 'analysis_tools',
                    'analyze_logs.py')
    assert osp.isfile(path), f'{lib} ships no analyze_logs.py at {path}'
    return path


def _write_log(path, metric: str, by_epoch: bool) -> str:
    """Four training lines and two validation lines as mmengine's LocalVisBackend writes
    them (``step`` is the iteration, or the epoch for validation lines of epoch-based runs)."""
    lines = []
    for it in range(1, 5):
        row = dict(lr=0.01 / it, data_time=0.01, loss=2.0 / it, time=0.1, iter=it, memory=10,
                   step=it)
        if by_epoch:
            row['epoch'] = 1 + (it - 1) // 2
        lines.append(row)
        if it % 2 == 0:
            lines.append({metric: 10.0 * it, 'data_time': 0.01, 'time': 0.1,
                          'step': it // 2 if by_epoch else it})
    path.write_text(''.join(json.dumps(r) + '\n' for r in lines))
    return str(path)


CASES = {
    # library: (argv after the script, metric, epoch-based log)
    'mmseg': (['--keys', 'loss', 'mIoU'], 'mIoU', False),
    'mmdet': (['plot_curve', '--keys', 'loss', 'bbox_mAP'], 'coco/bbox_mAP', True),
    'mmpretrain': (['plot_curve', '--keys', 'loss', 'accuracy/top1'], 'accuracy/top1', True),
}


@pytest.mark.parametrize('lib', sorted(CASES))
def test_library_analyze_logs_plots(lib, tmp_path):
    args, metric, by_epoch = CASES[lib]
    log = _write_log(tmp_path / 'scalars.json', metric, by_epoch)
    out = tmp_path / 'curve.png'
    argv = [sys.executable, _tool(lib)]
    if args[0] == 'plot_curve':   # sub-command first, then the logs
        argv += [args[0], log, *args[1:]]
    else:
        argv += [log, *args]
    env = dict(os.environ, MPLBACKEND='Agg', OMP_NUM_THREADS='1')
    proc = subprocess.run(argv + ['--out', str(out)], cwd=tmp_path, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert out.is_file() and out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
