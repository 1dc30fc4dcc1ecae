"""Summarise the data-parallel training + resume run of tools/gpu/multigpu.sh.

Reads the work dir of the two runs (mmengine writes ``<work_dir>/<timestamp>/<timestamp>.log`` and
``<work_dir>/<timestamp>/vis_data/scalars.json`` for each run; the first timestamp is the fresh
run, the second the resumed one) and writes ``multigpu.json`` and ``multigpu.md``.

    python tools/gpu/summarize_multigpu.py --work-dir WORK --out-dir OUT --meta META.json

``META.json`` (written by multigpu.sh) holds what the logs do not: the commands, the GPUs, the
per-GPU batch, the planned iterations and checkpoint interval. Only the standard library is used.
Exit status 0 when every check passed (see ``checks`` in the JSON), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional


def read_scalars(path: Path) -> List[dict]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def mean_loss(rows: List[dict], lo: int, hi: int) -> Optional[float]:
    """Mean of the logged ``loss`` over iterations ``lo < iter <= hi``.

    Each logged value is already the mean over the ``log interval`` iterations before it
    (mmengine's LogProcessor window), so the mean of the entries in the range is the mean loss of
    those iterations.
    """
    vals = [r['loss'] for r in rows if 'loss' in r and lo < r['iter'] <= hi]
    return statistics.fmean(vals) if vals else None


def run_info(run_dir: Path) -> dict:
    ts = run_dir.name
    log = run_dir / f'{ts}.log'
    text = log.read_text(errors='replace') if log.is_file() else ''
    rows = read_scalars(run_dir / 'vis_data' / 'scalars.json')
    train = [r for r in rows if 'iter' in r and 'loss' in r]
    val = [r for r in rows if 'mIoU' in r]
    info: Dict = dict(timestamp=ts, log=str(log), train_entries=len(train))
    m = re.search(r'resumed epoch: (\d+), iter: (\d+)', text)
    info['resumed_from_iter'] = int(m.group(2)) if m else None
    m = re.search(r'GPU number: (\d+)', text)
    info['world_size_logged'] = int(m.group(1)) if m else None
    m = re.search(r'Distributed training: (\w+)', text)
    info['distributed'] = m.group(1) == 'True' if m else None
    m = re.search(r'Load checkpoint from (\S+)', text)
    info['loaded_checkpoint'] = m.group(1) if m else None
    info['saved_checkpoints_at'] = [int(x) for x in
                                    re.findall(r'Saving checkpoint at (\d+) iterations', text)]
    info['errors'] = len(re.findall(r'Traceback|Error:', text))
    if train:
        info['first_logged_iter'] = train[0]['iter']
        info['last_iter'] = train[-1]['iter']
        # the first window holds start-up (CUDA init, cudnn benchmark, workers): leave it out
        steady = [r['time'] for r in train[1:]] or [train[0]['time']]
        info['sec_per_iter'] = statistics.fmean(steady)
        info['sec_per_iter_median'] = statistics.median(steady)
        info['data_time'] = statistics.fmean(r.get('data_time', 0.0) for r in train[1:] or train)
        mem = [r['memory'] for r in train if 'memory' in r]
        info['max_memory_mb'] = max(mem) if mem else None
        info['loss_first_logged'] = train[0]['loss']
        info['loss_last_logged'] = train[-1]['loss']
    if val:
        info['val'] = [dict(step=r.get('step'), mIoU=r.get('mIoU'), mAcc=r.get('mAcc'),
                            aAcc=r.get('aAcc')) for r in val]
    info['_train'] = train
    return info


def fmt(x, nd=4):
    if x is None:
        return 'n/a'
    if isinstance(x, float):
        return f'{x:.{nd}f}'
    return str(x)


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', required=True)
    p.add_argument('--out-dir', required=True)
    p.add_argument('--meta', required=True, help='JSON written by multigpu.sh')
    p.add_argument('--compare-work-dir',
                   help='work dir of the comparison run on the unfused mixer path (run 3)')
    return p.parse_args()


def _run_dirs(work: Optional[Path]) -> List[Path]:
    """The timestamped run directories mmengine made in ``work`` (oldest first)."""
    if work is None or not work.is_dir():
        return []
    return sorted(d for d in work.iterdir()
                  if d.is_dir() and re.fullmatch(r'\d{8}_\d{6}', d.name))


def _collect(args: argparse.Namespace) -> SimpleNamespace:
    """Everything the summary and the markdown report: the runs, losses, checkpoints, checks."""
    f = SimpleNamespace(work=Path(args.work_dir), meta=json.loads(Path(args.meta).read_text()))
    meta = f.meta
    f.runs = [run_info(d) for d in _run_dirs(f.work)]
    cmp_dirs = _run_dirs(Path(args.compare_work_dir) if args.compare_work_dir else None)
    f.compare = run_info(cmp_dirs[-1]) if cmp_dirs else {}
    f.first = f.runs[0] if f.runs else {}
    f.resumed = f.runs[1] if len(f.runs) > 1 else {}
    f.iters1 = int(meta['max_iters'])
    f.iters2 = int(meta['resume_max_iters'])
    f.window = int(meta.get('loss_window', 20))

    train1 = f.first.get('_train', [])
    train2 = f.resumed.get('_train', [])
    f.loss_first = mean_loss(train1, 0, f.window)
    f.loss_last_run1 = mean_loss(train1, f.iters1 - f.window, f.iters1)
    f.loss_last = mean_loss(train2, f.iters2 - f.window, f.iters2)
    if f.loss_last is None:
        f.loss_last = f.loss_last_run1
    f.decreasing = (f.loss_first is not None and f.loss_last is not None
                    and f.loss_last < f.loss_first)

    f.ckpts = []
    if f.work.is_dir():
        for c in sorted(f.work.glob('*.pth'), key=lambda c: (len(c.name), c.name)):
            f.ckpts.append(dict(file=c.name, bytes=c.stat().st_size,
                                MiB=round(c.stat().st_size / 2**20, 1)))
    f.names = {c['file'] for c in f.ckpts}
    interval = int(meta['checkpoint_interval'])
    f.expected = [f'iter_{i}.pth' for i in range(interval, f.iters2 + 1, interval)]
    if f'iter_{f.iters2}.pth' not in f.expected:
        f.expected.append(f'iter_{f.iters2}.pth')
    f.world = f.first.get('world_size_logged')

    f.checks = {
        'run1_reached_max_iters': f.first.get('last_iter') == f.iters1,
        'resumed_from_expected_iter': f.resumed.get('resumed_from_iter') == f.iters1,
        'run2_reached_max_iters': f.resumed.get('last_iter') == f.iters2,
        'checkpoints_present': all(e in f.names for e in f.expected),
        'world_size_as_launched': f.world == int(meta['world_size']),
        'loss_decreasing': bool(f.decreasing),
    }
    # a CPU smoke test runs a handful of iterations: its loss trend is noise, not a check
    f.required = {k: v for k, v in f.checks.items()
                  if k != 'loss_decreasing' or meta.get('require_loss_decrease', True)}
    return f


def _summary(f: SimpleNamespace) -> dict:
    """``multigpu.json``."""
    meta, first, resumed, compare = f.meta, f.first, f.resumed, f.compare
    return dict(
        ok=all(f.required.values()),
        checks=f.checks,
        mode=meta.get('mode'),
        config=meta.get('config'),
        world_size=f.world,
        world_size_launched=int(meta['world_size']),
        distributed=first.get('distributed'),
        gpus=meta.get('gpus'),
        per_gpu_batch=int(meta['per_gpu_batch']),
        total_batch=int(meta['per_gpu_batch']) * int(meta['world_size']),
        crop_size=meta.get('crop_size'),
        iterations=dict(run1_planned=f.iters1, run1_last=first.get('last_iter'),
                        run2_planned=f.iters2,
                        run2_resumed_from=resumed.get('resumed_from_iter'),
                        run2_first_logged=resumed.get('first_logged_iter'),
                        run2_last=resumed.get('last_iter')),
        loss=dict(window=f.window, first_mean=f.loss_first, run1_last_mean=f.loss_last_run1,
                  last_mean=f.loss_last, decreasing=bool(f.decreasing),
                  note='rank 0 loss, mean of the logged values (each a mean over the log '
                       'interval); the final mean is that of the resumed run'),
        sec_per_iter=dict(run1=first.get('sec_per_iter'), run2=resumed.get('sec_per_iter'),
                          run1_median=first.get('sec_per_iter_median'),
                          run2_median=resumed.get('sec_per_iter_median'),
                          data_time_run1=first.get('data_time'),
                          data_time_run2=resumed.get('data_time')),
        max_memory_mb=dict(run1=first.get('max_memory_mb'), run2=resumed.get('max_memory_mb'),
                           run3_unfused=compare.get('max_memory_mb')),
        mixer_path=meta.get('mixer_path'), amp=meta.get('amp'),
        unfused_compare=dict(
            sec_per_iter=compare.get('sec_per_iter'), last_iter=compare.get('last_iter'),
            run1_over_run3=(round(first['sec_per_iter'] / compare['sec_per_iter'], 3)
                            if first.get('sec_per_iter') and compare.get('sec_per_iter')
                            else None),
            note='run 3: the same config and start on the unfused mixer path '
                 '(AMVIM_FUSED_MIXER=0); s/iter mean with the first log window excluded'),
        val=dict(run1=first.get('val'), run2=resumed.get('val')),
        checkpoints=f.ckpts,
        checkpoints_expected=f.expected,
        resume_loaded=resumed.get('loaded_checkpoint'),
        saved_at=dict(run1=first.get('saved_checkpoints_at'),
                      run2=resumed.get('saved_checkpoints_at')),
        wall_s=meta.get('wall_s'),
        commands=meta.get('commands', []),
        runs=[{k: v for k, v in r.items() if not k.startswith('_')} for r in f.runs],
        extra_runs_in_work_dir=max(0, len(f.runs) - 2),
    )


def yn(b):
    return 'yes' if b else 'NO'


def _table(f: SimpleNamespace, summary: dict) -> List[str]:
    """The markdown's table of facts."""
    meta, first, resumed, compare = f.meta, f.first, f.resumed, f.compare
    v1 = (first.get('val') or [{}])[-1].get('mIoU')
    v2 = (resumed.get('val') or [{}])[-1].get('mIoU')
    window = f.window
    return [
        '| | |', '| --- | --- |',
        f"| world size (logged / launched) | {fmt(f.world)} / {meta['world_size']} |",
        f"| GPUs | {'; '.join(meta.get('gpus') or []) or 'n/a'} |",
        f"| batch per GPU / total | {meta['per_gpu_batch']} / {summary['total_batch']} |",
        f"| run 1 iterations (planned / last) | {f.iters1} / {fmt(first.get('last_iter'))} |",
        f"| run 2 resumed from iteration | {fmt(resumed.get('resumed_from_iter'))} "
        f"(expected {f.iters1}; checkpoint {resumed.get('loaded_checkpoint')}) |",
        f"| run 2 iterations (planned / last) | {f.iters2} / {fmt(resumed.get('last_iter'))} |",
        f"| mean loss, iterations 1-{window} | {fmt(f.loss_first)} |",
        f"| mean loss, last {window} of run 1 | {fmt(f.loss_last_run1)} |",
        f"| mean loss, last {window} (after resume) | {fmt(f.loss_last)} |",
        f"| loss decreasing | {yn(f.decreasing)} |",
        f"| s/iter run 1 / run 2 (mean, first log window excluded) | "
        f"{fmt(first.get('sec_per_iter'))} / {fmt(resumed.get('sec_per_iter'))} |",
        f"| max memory MB (rank 0) run 1 / run 2 | {fmt(first.get('max_memory_mb'))} / "
        f"{fmt(resumed.get('max_memory_mb'))} |",
        f"| mixer path runs 1-2 / run 3; autocast | "
        f"{(meta.get('mixer_path') or {}).get('run1_run2')} / "
        f"{(meta.get('mixer_path') or {}).get('run3')}; {meta.get('amp')} |",
        f"| s/iter run 3 (unfused path, {fmt(compare.get('last_iter'))} iterations); "
        f"run 1 / run 3 | {fmt(compare.get('sec_per_iter'))}; "
        f"{fmt(summary['unfused_compare']['run1_over_run3'], 3)} |",
        f"| max memory MB (rank 0) run 3 | {fmt(compare.get('max_memory_mb'))} |",
        f"| val mIoU after run 1 / run 2 | {fmt(v1, 2)} / {fmt(v2, 2)} |",
        f"| wall time of the script (s) | {fmt(meta.get('wall_s'))} |",
    ]


def _markdown(f: SimpleNamespace, summary: dict) -> List[str]:
    """``multigpu.md``, as lines."""
    meta = f.meta
    lines = [
        f"# Data-parallel training run ({meta.get('mode')})",
        '',
        f"Config: `{meta.get('config')}`, crop {meta.get('crop_size')}, tiny synthetic ADE20K "
        f"({meta.get('dataset')}). All checks passed: **{yn(summary['ok'])}**.",
        '',
    ] + _table(f, summary) + ['', '## Checks', '']
    lines += [f'- {k}: {yn(v)}' + ('' if k in f.required else ' (not required in this mode)')
              for k, v in f.checks.items()]
    lines += ['', '## Checkpoints', '']
    lines += [f"- `{c['file']}` {c['MiB']} MiB" for c in f.ckpts] or ['- none']
    missing = [e for e in f.expected if e not in f.names]
    if missing:
        lines.append(f'- missing: {", ".join(missing)}')
    lines += ['', '## Commands', '', '```bash']
    lines += meta.get('commands', [])
    lines += ['```', '']
    return lines


def main() -> int:
    args = _parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f = _collect(args)
    summary = _summary(f)
    (out / 'multigpu.json').write_text(json.dumps(summary, indent=2) + '\n')
    lines = _markdown(f, summary)
    (out / 'multigpu.md').write_text('\n'.join(lines))
    print('\n'.join(lines))
    return 0 if summary['ok'] else 1


if __name__ == '__main__':
    raise SystemExit(main())
