"""The benchmark harness behind ``tools/benchmark.py``: benchmark models and their timing
(:mod:`~amvim_mm.bench.measure`), the cpu suite (:mod:`~amvim_mm.bench.cpu`), the gpu suite's
parts (:mod:`~amvim_mm.bench.gpu`), the dense-task suite (:mod:`~amvim_mm.bench.dense`), the
official Vim and VMamba code timed beside ours (:mod:`~amvim_mm.bench.official_vim`,
:mod:`~amvim_mm.bench.official_vmamba`), the runner and its results files
(:mod:`~amvim_mm.bench.run`) and the environment report with the kernels' state
(:mod:`~amvim_mm.bench.environment`).

The measuring API the sweep and the tools share (FLOPs, statistics, ERF, token survival,
verdicts) stays in :mod:`amvim_mm.analysis`.
"""
