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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', required=True)
    p.add_argument('--out-dir', required=True)
    p.add_argument('--meta', required=True, help='JSON written by multigpu.sh')
    p.add_argument('--compare-work-dir',
                   help='work dir of the comparison run on the unfused mixer path (run 3)')
    args = p.parse_args()
    work = Path(args.work_dir)
    meta = json.loads(Path(args.meta).read_text())
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    run_dirs = sorted(d for d in work.iterdir()
                      if d.is_dir() and re.fullmatch(r'\d{8}_\d{6}', d.name)) \
        if work.is_dir() else []
    runs = [run_info(d) for d in run_dirs]
    cmp_dirs = sorted(d for d in Path(args.compare_work_dir).iterdir()
                      if d.is_dir() and re.fullmatch(r'\d{8}_\d{6}', d.name)) \
        if args.compare_work_dir and Path(args.compare_work_dir).is_dir() else []
    compare = run_info(cmp_dirs[-1]) if cmp_dirs else {}
    first = runs[0] if runs else {}
    resumed = runs[1] if len(runs) > 1 else {}
    iters1 = int(meta['max_iters'])
    iters2 = int(meta['resume_max_iters'])
    window = int(meta.get('loss_window', 20))

    train1 = first.get('_train', [])
    train2 = resumed.get('_train', [])
    loss_first = mean_loss(train1, 0, window)
    loss_last_run1 = mean_loss(train1, iters1 - window, iters1)
    loss_last = mean_loss(train2, iters2 - window, iters2)
    if loss_last is None:
        loss_last = loss_last_run1
    decreasing = (loss_first is not None and loss_last is not None and loss_last < loss_first)

    ckpts = []
    if work.is_dir():
        for f in sorted(work.glob('*.pth'), key=lambda f: (len(f.name), f.name)):
            ckpts.append(dict(file=f.name, bytes=f.stat().st_size,
                              MiB=round(f.stat().st_size / 2**20, 1)))
    names = {c['file'] for c in ckpts}
    interval = int(meta['checkpoint_interval'])
    expected = [f'iter_{i}.pth' for i in range(interval, iters2 + 1, interval)]
    if f'iter_{iters2}.pth' not in expected:
        expected.append(f'iter_{iters2}.pth')
    world = first.get('world_size_logged')

    checks = {
        'run1_reached_max_iters': first.get('last_iter') == iters1,
        'resumed_from_expected_iter': resumed.get('resumed_from_iter') == iters1,
        'run2_reached_max_iters': resumed.get('last_iter') == iters2,
        'checkpoints_present': all(e in names for e in expected),
        'world_size_as_launched': world == int(meta['world_size']),
        'loss_decreasing': bool(decreasing),
    }
    # a CPU smoke test runs a handful of iterations: its loss trend is noise, not a check
    required = {k: v for k, v in checks.items()
                if k != 'loss_decreasing' or meta.get('require_loss_decrease', True)}
    summary = dict(
        ok=all(required.values()),
        checks=checks,
        mode=meta.get('mode'),
        config=meta.get('config'),
        world_size=world,
        world_size_launched=int(meta['world_size']),
        distributed=first.get('distributed'),
        gpus=meta.get('gpus'),
        per_gpu_batch=int(meta['per_gpu_batch']),
        total_batch=int(meta['per_gpu_batch']) * int(meta['world_size']),
        crop_size=meta.get('crop_size'),
        iterations=dict(run1_planned=iters1, run1_last=first.get('last_iter'),
                        run2_planned=iters2, run2_resumed_from=resumed.get('resumed_from_iter'),
                        run2_first_logged=resumed.get('first_logged_iter'),
                        run2_last=resumed.get('last_iter')),
        loss=dict(window=window, first_mean=loss_first, run1_last_mean=loss_last_run1,
                  last_mean=loss_last, decreasing=bool(decreasing),
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
        checkpoints=ckpts,
        checkpoints_expected=expected,
        resume_loaded=resumed.get('loaded_checkpoint'),
        saved_at=dict(run1=first.get('saved_checkpoints_at'),
                      run2=resumed.get('saved_checkpoints_at')),
        wall_s=meta.get('wall_s'),
        commands=meta.get('commands', []),
        runs=[{k: v for k, v in r.items() if not k.startswith('_')} for r in runs],
        extra_runs_in_work_dir=max(0, len(runs) - 2),
    )
    (out / 'multigpu.json').write_text(json.dumps(summary, indent=2) + '\n')

    def yn(b):
        return 'yes' if b else 'NO'

    v1 = (first.get('val') or [{}])[-1].get('mIoU')
    v2 = (resumed.get('val') or [{}])[-1].get('mIoU')
    lines = [
        f"# Data-parallel training run ({meta.get('mode')})",
        '',
        f"Config: `{meta.get('config')}`, crop {meta.get('crop_size')}, tiny synthetic ADE20K "
        f"({meta.get('dataset')}). All checks passed: **{yn(summary['ok'])}**.",
        '',
        '| | |', '| --- | --- |',
        f"| world size (logged / launched) | {fmt(world)} / {meta['world_size']} |",
        f"| GPUs | {'; '.join(meta.get('gpus') or []) or 'n/a'} |",
        f"| batch per GPU / total | {meta['per_gpu_batch']} / {summary['total_batch']} |",
        f"| run 1 iterations (planned / last) | {iters1} / {fmt(first.get('last_iter'))} |",
        f"| run 2 resumed from iteration | {fmt(resumed.get('resumed_from_iter'))} "
        f"(expected {iters1}; checkpoint {resumed.get('loaded_checkpoint')}) |",
        f"| run 2 iterations (planned / last) | {iters2} / {fmt(resumed.get('last_iter'))} |",
        f"| mean loss, iterations 1-{window} | {fmt(loss_first)} |",
        f"| mean loss, last {window} of run 1 | {fmt(loss_last_run1)} |",
        f"| mean loss, last {window} (after resume) | {fmt(loss_last)} |",
        f"| loss decreasing | {yn(decreasing)} |",
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
        '',
        '## Checks', '',
    ]
    lines += [f'- {k}: {yn(v)}' + ('' if k in required else ' (not required in this mode)')
              for k, v in checks.items()]
    lines += ['', '## Checkpoints', '']
    lines += [f"- `{c['file']}` {c['MiB']} MiB" for c in ckpts] or ['- none']
    missing = [e for e in expected if e not in names]
    if missing:
        lines.append(f'- missing: {", ".join(missing)}')
    lines += ['', '## Commands', '', '```bash']
    lines += meta.get('commands', [])
    lines += ['```', '']
    (out / 'multigpu.md').write_text('\n'.join(lines))
    print('\n'.join(lines))
    return 0 if summary['ok'] else 1


if __name__ == '__main__':
    raise SystemExit(main())
