"""Training-free token-reduction sweeps: metric vs reduction ratio for several models.

For every model (config + checkpoint) and every method and ratio, the backbone's reducer is
switched on (AMVim protocol), the config's test loop runs through the library's own metric
(mIoU / COCO AP / Top-1), and the result is stored with the analytic GFLOPs and the realised
ratio. Every finished run is *merged* into ``results.json``: under an exclusive ``flock`` on
``results.json.lock`` next to it the file is read again, this run's rows are added (replacing
rows with the same model, method and ratio) and the file is replaced atomically. So an
interrupted sweep keeps what it finished, a second call resumes where it stopped, and sweeps
running at the same time into one out-dir (e.g. one per method) keep each other's rows.

Resuming keys on the model name, method and ratio *and* on what produced the row. Each row stores

* ``checkpoint_sha256``: sha256 of the checkpoint file's bytes (read in 1 MiB chunks);
* ``config_sha256``: sha256 of ``pretty_text`` of the config as loaded, i.e. with its
  ``_base_`` files merged and ``--cfg-options`` applied, but without the run-specific
  ``work_dir`` and ``launcher`` (another out-dir does not invalidate rows; an edited base file
  or another override does).

Rows of a model name whose hashes differ from this run's are stale: they are recomputed and
replaced (one line on stderr says so), never reused. ``results.json`` thus holds rows of one
checkpoint and config per model name, and the ratio-0 baseline of the ``drop`` column is always
a row with the same hashes. Ratio 0 (no reduction) is evaluated once per model and precision
and reused for every method.

Methods and their schedules (:mod:`amvim_mm.apis.sweep.methods`, shared with ``tools/test.py
--reduce``, which thus measures what a cell does): ``tome`` and ``random`` use the AMVim
protocol (``ratio``); ``evit`` and ``top`` prune after blocks (``locations``, default ToP-ViM's
Tiny schedule scaled to the depth, :meth:`ReductionSchedule.importance_locations`) at the keep
rate whose realised ratio is nearest to the requested one
(:meth:`ReductionSchedule.keep_rate_for_ratio`); the keep rate and the realised ratio are stored
with the row. ``random`` is evaluated for every ``seeds``
entry: the row's metric is their mean, with ``metric_seeds`` and ``seed_std``.

``learned`` evaluates the learned reducer the model's own config carries (e.g. a
``*_dynamicvit.py`` fine-tuning config and its checkpoint): one row per model at the reducer's
realised ratio (the ``ratios`` do not apply), labelled with the reducer and how long it was
fine-tuned (``fine_tuned``: ``'fine-tuned N epochs'`` / ``'... N iterations'`` from the
checkpoint's ``meta``); the other methods run on the same fine-tuned weights with the
learned reducer switched off.

Intervals: every evaluation also keeps per-image statistics (``per_image/*.npz``, see
:mod:`amvim_mm.analysis.stats`); after the sweep a paired bootstrap over images (one set of
resampled images per data set, shared by every row) gives each row ``ci_low``/``ci_high`` (95 %),
the drop from ratio 0 with ``drop_ci_low``/``drop_ci_high``, and for every pair of models the
difference of their drops at each method and ratio with its interval
(``paired_differences``). A row whose protocol (seeds, locations, FLOPs convention, speed
measurement) differs from the requested one is recomputed.

The package: :mod:`.methods` (the method table, shared with ``tools/test.py``), :mod:`.rows`
(:class:`SweepRow`, a row's key and baseline), :mod:`.store` (``results.json``, its lock, the
fingerprints, the merge), :mod:`.cell` (one model's cells evaluated), :mod:`.workers`
(``--jobs``), :mod:`.run` (:func:`run_sweep`), :mod:`.intervals` (the final pass's statistics),
:mod:`.report` (tables), :mod:`.plots` (metric vs ratio, the forest plot of the verdicts) and
:mod:`.summary` (``summary.md``, ``checkpoint_differences.md``).
"""
from amvim_mm.apis.sweep.cell import PRIMARY_METRICS, ModelCells, fine_tuning_label
from amvim_mm.apis.sweep.intervals import add_intervals
from amvim_mm.apis.sweep.methods import (IMPORTANCE_METHODS, LEARNED, METHODS, SEEDED_METHODS,
                                         cell_reducer, check_method, check_ratio,
                                         config_has_learned_reducer, learned_reducer,
                                         reduction_config)
from amvim_mm.apis.sweep.plots import drawn, forest_rows, plot, plot_forest
from amvim_mm.apis.sweep.report import group_table, markdown_table, verdict_table
from amvim_mm.apis.sweep.rows import ABSENT, Fingerprint, SweepRow
from amvim_mm.apis.sweep.run import PRECISIONS, STATISTICS, model_name, run_sweep, validate
from amvim_mm.apis.sweep.summary import (architectures, auc_table, cell_table,
                                         checkpoint_differences, summary_lines,
                                         summary_markdown, verdict_family)
from amvim_mm.apis.sweep.store import (config_sha256, file_sha256, load_results,
                                       merge_results, prepare_out_dir, protocol, results_lock,
                                       strict_json)

__all__ = [
    'ABSENT', 'IMPORTANCE_METHODS', 'LEARNED', 'METHODS', 'PRECISIONS', 'PRIMARY_METRICS',
    'SEEDED_METHODS', 'STATISTICS', 'Fingerprint', 'ModelCells', 'SweepRow', 'add_intervals',
    'architectures', 'auc_table', 'cell_reducer', 'cell_table', 'check_method', 'check_ratio',
    'checkpoint_differences', 'config_has_learned_reducer', 'config_sha256', 'drawn',
    'file_sha256', 'fine_tuning_label', 'forest_rows', 'group_table', 'learned_reducer',
    'load_results', 'markdown_table', 'merge_results', 'model_name', 'plot', 'plot_forest',
    'prepare_out_dir', 'protocol', 'reduction_config', 'results_lock', 'run_sweep',
    'strict_json', 'summary_lines', 'summary_markdown', 'validate', 'verdict_family',
    'verdict_table']
