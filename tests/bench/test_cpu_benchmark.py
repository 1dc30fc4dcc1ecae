"""The CPU benchmark suite (amvim_mm/bench/cpu.py): the ratios of one run, and a
tiny end-to-end run (small archs, one forward per round) with every column filled."""
from amvim_mm.bench import cpu as CB


def test_summary_ratios():
    rows = [dict(model='deit-tiny', kernels='timm', tome=0.0, latency_ms=20.0),
            dict(model='vim-t', kernels='compiled', tome=0.0, gflops=2.0, latency_ms=40.0),
            dict(model='vim-t', kernels='torch', tome=0.0, gflops=2.0, latency_ms=160.0),
            dict(model='amvim-t', kernels='compiled', tome=0.0, gflops=2.0, latency_ms=42.0),
            dict(model='vim-t', kernels='compiled', tome=0.46, gflops=1.0, latency_ms=25.0),
            dict(model='vim-t', kernels='compiled', tome=0.0, gflops=2.0, latency_ms=300.0,
                 batch=8, rounds_ms=[300.0, 600.0, 290.0]),
            dict(model='vim-t', kernels='compiled', tome=0.46, gflops=1.0, latency_ms=166.7,
                 batch=8, rounds_ms=[150.0, 160.0, 300.0])]
    s = CB.summarize(rows)
    assert s == {'vim_t_vs_deit_tiny': 2.0, 'amvim_t_over_vim_t': 1.05,
                 'tome_0.46_speedup_over_ideal': 0.8, 'vim_t_compiled_over_torch': 4.0,
                 'tome_0.46_batch8_speedup_over_ideal': 0.9,
                 'tome_0.46_batch8_paired_over_ideal': 1.0}
    tome = rows[4]
    assert (tome['speedup'], tome['flops_ratio']) == (1.6, 2.0)
    # the batch-8 rows are compared with each other only (not with batch-1 DeiT or Vim-T)
    assert (rows[-1]['speedup'], rows[-1]['flops_ratio']) == (1.8, 2.0)
    assert 'vs_deit_tiny' not in rows[-1] and 'speedup' not in rows[-2]
    # paired: the median of the rounds' ratios (2.0, 3.75, 0.967), over the FLOPs ratio
    assert rows[-1]['paired_over_ideal'] == 1.0 and 'paired_over_ideal' not in rows[4]
    assert 'speedup_vs_torch' not in rows[2]          # the baseline row itself


def test_tiny_run_interleaves_and_reports(capsys):
    rows = (('vim-test', 'vim-test', 'compiled', None), ('vim-test', 'vim-test', 'torch', None),
            ('vim-test', 'vim-test', 'compiled', 0.27),
            ('vim-test', 'vim-test', 'compiled', None, 2))
    res = CB.run_cpu_suite(1, iters=1, repeats=2, warmup=1, rows=rows)
    assert [r['kernels'] for r in res['rows']] == ['compiled', 'torch'] + ['compiled'] * 2
    assert [r['batch'] for r in res['rows']] == [1, 1, 1, 2]
    for r in res['rows']:
        assert r['latency_ms'] > 0 and r['min_ms'] <= r['latency_ms'] and r['gflops'] > 0
    assert res['rows'][0]['speedup_vs_torch'] > 0
    assert res['rows'][2]['flops_ratio'] > 1 and res['rows'][2]['paired_over_ideal'] > 0
    assert all(len(r['rounds_ms']) == 2 for r in res['rows'])
    assert capsys.readouterr().out.count('round') == 2


def test_reducer_rows_summary():
    """``--cpu-rows reduction``: reducer rows against the unreduced row of their batch, and
    ToP's aligned latency over its unaligned one."""
    base = dict(model='vim-t', kernels='compiled', tome=0.0, reducer='', gflops=1.8,
                latency_ms=330.0, batch=8)
    rows = [base] + [dict(base, reducer=label, gflops=g, latency_ms=t) for label, g, t in (
        ('ToP 0.7', 1.44, 300.0), ('ToP 0.7 noalign', 1.44, 275.0), ('ToMe 0.46', 0.99, 200.0))]
    s = CB.summarize(rows)
    assert s['ToP_0.7_aligned_over_unaligned'] == round(300 / 275, 3)
    assert s['ToMe_0.46_speedup'] == 1.65 and s['ToMe_0.46_over_ideal'] == round(1.65 / 1.818, 3)
    assert 'ToP_0.7_noalign_aligned_over_unaligned' not in s
    labels = [r[3][0] for r in CB.REDUCTION_ROWS[1:]]
    assert CB.REDUCTION_ROWS[0][3] is None and 'ToP 0.7' in labels and 'ToP 0.7 noalign' in labels
