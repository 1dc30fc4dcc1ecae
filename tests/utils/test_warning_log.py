"""Library warnings to a log file (prune_eval's progress bar stays clean)."""
import warnings

import pytest

from amvim_mm.utils.warning_log import warnings_to_file


def test_warnings_go_to_the_file_once_each_and_not_to_stderr(tmp_path, capsys):
    log = tmp_path / 'sub' / 'w.log'
    with warnings_to_file(str(log)):
        for _ in range(3):
            warnings.warn_explicit('deprecated thing', UserWarning, 'lib.py', 7)
        warnings.warn_explicit('another', DeprecationWarning, 'lib.py', 9)
    text = log.read_text()
    assert text.count('lib.py:7: UserWarning: deprecated thing') == 1
    assert 'lib.py:9: DeprecationWarning: another' in text
    assert 'deprecated' not in capsys.readouterr().err
    # the handler is restored after the block
    with pytest.warns(UserWarning, match='after'):
        warnings.warn('after', UserWarning)
    assert 'after' not in log.read_text()


def test_the_filters_still_decide_and_disabled_is_a_no_op(tmp_path):
    log = tmp_path / 'w.log'
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with pytest.raises(UserWarning, match='as error'), warnings_to_file(str(log)):
            warnings.warn('as error', UserWarning)
    assert not log.exists()
    with pytest.warns(UserWarning, match='on screen'), warnings_to_file(str(log),
                                                                         enabled=False):
        warnings.warn('on screen', UserWarning)
    assert not log.exists()
