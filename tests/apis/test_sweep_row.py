"""``SweepRow``: the typed row of ``results.json`` writes the dict the file has always held (keys
and their order), and a row read from the file comes back byte for byte."""
import json

from amvim_mm.apis.sweep import ABSENT, SweepRow, merge_results

#: the keys of an evaluated row with pruning seeds, in the file's order (before the merge)
EVALUATED = ['model', 'config', 'checkpoint', 'method', 'ratio', 'precision', 'protocol',
             'reduction', 'realised_ratio', 'gflops', 'gflops_convention', 'metric_name',
             'metric', 'metric_library', 'final_tokens', 'seconds', 'images', 'stats_file',
             'checkpoint_sha256', 'config_sha256', 'seeds', 'metric_seeds', 'seed_std']
INTERVALS = ['drop', 'ci_low', 'ci_high', 'drop_ci_low', 'drop_ci_high', 'relative_drop',
             'relative_drop_ci_low', 'relative_drop_ci_high']


def _row(**kw) -> SweepRow:
    base = dict(model='a', config='a.py', checkpoint='a.pth', method='random', ratio=0.3,
                precision='fp32', protocol='flops=mamba;metric=exact', reduction=dict(
                    type='RandomPrune', ratio=0.3, seed=1), realised_ratio=0.2981,
                gflops=0.0123, gflops_convention='mamba', metric_name='mIoU', metric=41.5,
                metric_library=41.49, final_tokens=9, seconds=1.25, images=12,
                stats_file='per_image/a/random_0.3_fp32.npz', checkpoint_sha256='c' * 64,
                config_sha256='f' * 64)
    base.update(kw)
    return SweepRow(**base)


def test_an_evaluated_row_has_the_file_keys_in_order():
    row = _row()
    row.seeds, row.metric_seeds, row.seed_std = [0, 1], [41.0, 42.0], 0.7071
    d = row.to_dict()
    assert list(d) == EVALUATED
    assert d['reduction'] == dict(type='RandomPrune', ratio=0.3, seed=1)
    row.img_per_s_test_loop = 120.5     # on a GPU without --measure-speed: last
    assert list(row.to_dict()) == EVALUATED + ['img_per_s_test_loop']


def test_the_merge_adds_drop_and_a_read_row_round_trips(tmp_path):
    """The merged file's row (drop appended by the merge) read back and written again gives
    the same JSON text; None stays null, absent fields stay absent."""
    path = str(tmp_path / 'results.json')
    zero = _row(method='tome', ratio=0.0, reduction=None, metric=45.0).to_dict()
    data = merge_results(path, [zero, _row().to_dict()])
    for r in data['results']:
        again = SweepRow.from_dict(r)
        assert again.seeds is ABSENT and again.fine_tuned is ABSENT
        assert json.dumps(again.to_dict()) == json.dumps(r)
    assert [r['drop'] for r in data['results']] == [-3.5, 0.0]
    assert list(data['results'][0]) == EVALUATED[:-3] + ['drop']


def test_rows_of_other_versions_keep_their_keys_and_order():
    """A row written by another version (unknown keys, another order, missing fields) is
    written back exactly as read, also after a field changes."""
    old = {'ratio': 0.0, 'model': 'a', 'method': 'tome', 'metric': 40.0, 'note': 'hand-made',
           'drop': None, 'ci_low': None}
    row = SweepRow.from_dict(old)
    assert row.extra == {'note': 'hand-made'} and row.config is ABSENT
    assert json.dumps(row.to_dict()) == json.dumps(old)
    row.method = 'random'
    assert row.to_dict() == dict(old, method='random')
    assert list(row.to_dict()) == list(old)
    full = dict(_row().to_dict(), **{k: None for k in INTERVALS})
    assert list(SweepRow.from_dict(full).to_dict()) == EVALUATED[:-3] + INTERVALS
