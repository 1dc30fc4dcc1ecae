"""A sweep's models evaluated side by side in worker processes (``--jobs``): each worker runs
one model's cells at a time with its share of the cores and merges its rows into
``results.json`` under the lock, as one process would.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

from amvim_mm.apis.sweep.rows import Fingerprint, fingerprint
from amvim_mm.apis.sweep.store import load_results
from amvim_mm.errors import ConfigError


def _worker_init(threads: int) -> None:
    """A sweep worker's start: its share of the cores (before any torch op runs)."""
    import warnings
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
    import torch
    torch.set_num_threads(threads)


def sweep_in_workers(target: Callable[[dict], None], tasks: Sequence[dict], jobs: int, bar,
                     path: str, prints: Dict[str, Fingerprint]) -> None:
    """Run ``target(task)`` for every task (``run_sweep`` keyword sets, one model each; a
    module-level function, since the workers are spawned) in ``jobs`` worker processes, each
    with ``torch.get_num_threads() // jobs`` threads (two torch processes that both spin on
    every core run far slower than one), a worker taking the next model when it is done
    with one. ``bar`` follows the rows in ``path``. After the first worker error no further
    model starts (the running ones finish theirs) and the error is raised here; the rows
    finished so far stay, and a rerun resumes."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    import torch
    jobs = min(jobs, len(tasks))
    threads = max(1, torch.get_num_threads() // jobs)
    start, before = bar.n, _rows_done(path, prints, tasks)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context('spawn'),
                             initializer=_worker_init, initargs=(threads, )) as ex:
        futures = [ex.submit(target, t) for t in tasks]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=2.0, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in finished):
                for f in pending:
                    f.cancel()
                break
            bar.n = start + max(0, _rows_done(path, prints, tasks) - before)
            bar.refresh()
        for f in futures:
            if f.done() and not f.cancelled() and f.exception() is not None:
                raise f.exception()


def _rows_done(path: str, prints: Dict[str, Fingerprint], tasks: Sequence[dict]) -> int:
    """How many rows of ``tasks``' models (with this sweep's fingerprints) ``path`` holds now,
    for the progress bar (an unreadable file counts as none)."""
    names = {t['names'][0] for t in tasks}
    try:
        rows = load_results(path)['results']
    except (OSError, ValueError, ConfigError):
        return 0
    return sum(1 for r in rows if r['model'] in names and fingerprint(r) == prints[r['model']])
