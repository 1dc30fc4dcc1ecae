"""The documentation keeps its promises: a short README whose two commands are the ones
``run.sh`` (and ``.ci/run``) accept, short recipes whose code runs, links that resolve, a
docs index that names every page and config folder, config names that exist, and the demo's
checkpoint and seed counts as the code has them.

A ``python`` block of a ``docs/how_to_add_*.md`` recipe runs (the blocks of one page in order,
sharing their names, inside a scope that restores the registries afterwards); a block whose
first line is the comment ``# fragment`` (a piece of a larger file, e.g. with relative imports)
is only compiled.
"""
import contextlib
import fnmatch
import importlib.util
import itertools
import os
import os.path as osp
import re
from glob import glob

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
README = osp.join(ROOT, 'README.md')
RECIPES = sorted(glob(osp.join(ROOT, 'docs', 'how_to_add_*.md')))
PAGES = [README] + sorted(glob(osp.join(ROOT, 'docs', '*.md')))
FRAGMENT = '# fragment'
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')


def _read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def _blocks(text, lang):
    return re.findall(rf'^```{lang}\n(.*?)^```', text, re.S | re.M)


def test_readme_is_short():
    n = len(_read(README).splitlines())
    assert n <= 200, f'README.md has {n} lines (at most 200); move details to docs/'


@pytest.mark.parametrize('path', RECIPES, ids=osp.basename)
def test_recipe_is_short(path):
    n = len(_read(path).splitlines())
    assert n <= 100, f'{osp.basename(path)} has {n} lines (at most 100)'


def test_there_are_recipes():
    names = {osp.basename(p) for p in RECIPES}
    assert {'how_to_add_a_backbone.md', 'how_to_add_a_scan_order.md',
            'how_to_add_a_reducer.md', 'how_to_add_a_kernel.md'} <= names, names


@pytest.mark.parametrize('path', PAGES, ids=lambda p: osp.relpath(p, ROOT))
def test_relative_links_resolve(path):
    missing = []
    for target in LINK.findall(_read(path)):
        if re.match(r'[a-z][a-z0-9+.-]*:', target) or target.startswith('#'):
            continue   # a URL or an anchor on the same page
        file = target.split('#', 1)[0]
        if not osp.exists(osp.normpath(osp.join(osp.dirname(path), file))):
            missing.append(target)
    assert not missing, f'{osp.relpath(path, ROOT)} links to missing files: {missing}'


def test_docs_index_names_every_page():
    index = _read(osp.join(ROOT, 'docs', 'README.md'))
    linked = {osp.basename(t.split('#', 1)[0]) for t in LINK.findall(index)}
    pages = {osp.basename(p) for p in glob(osp.join(ROOT, 'docs', '*.md'))} - {'README.md'}
    assert pages <= linked, f'docs/README.md does not link {sorted(pages - linked)}'


def _commands(block):
    return [line.split('#', 1)[0].strip() for line in block.splitlines()
            if line.split('#', 1)[0].strip()]


def test_the_two_commands_are_the_ones_run_sh_accepts():
    text = _read(README)
    section = text.split('## The two commands', 1)[1]
    commands = _commands(_blocks(section, 'bash')[0])
    assert commands == ['bash run.sh demo', 'bash run.sh test'], commands
    run_sh = _read(osp.join(ROOT, 'run.sh'))
    case = run_sh.split('case "$what" in', 1)[1].split('esac', 1)[0]
    accepted = set(re.findall(r'^\s*([a-z]+)\)', case, re.M))
    assert {c.split()[-1] for c in commands} <= accepted, accepted
    # .ci/run runs the README's test command verbatim
    ci = [c for c in _commands(_read(osp.join(ROOT, '.ci', 'run'))) if 'run.sh' in c]
    assert ci and set(ci) <= set(commands), ci


@contextlib.contextmanager
def _registry_scope():
    """Registrations made inside (scan orders, reducers, backbones) are undone afterwards."""
    from amvim_mm.models.layout import scan_orders
    from amvim_mm.models.reduction import TOKEN_REDUCERS
    from amvim_mm.registry import MODELS
    tables = [scan_orders.SCAN_ORDERS, TOKEN_REDUCERS.module_dict, MODELS.module_dict]
    saved = [dict(t) for t in tables]
    try:
        yield
    finally:
        for table, copy in zip(tables, saved, strict=True):
            table.clear()
            table.update(copy)
        for obj in vars(scan_orders).values():   # ranks cached under a removed order's name
            if hasattr(obj, 'cache_clear'):
                obj.cache_clear()


@pytest.mark.parametrize('path', RECIPES, ids=osp.basename)
def test_recipe_code_runs(path):
    import amvim_mm  # noqa: F401  (registers what the recipes build on)
    name = osp.basename(path)
    blocks = _blocks(_read(path), 'python')
    namespace = {'__name__': 'docs_recipe'}
    with _registry_scope():
        for i, block in enumerate(blocks):
            code = compile(block, f'{name}, python block {i + 1}', 'exec')
            if block.lstrip().startswith(FRAGMENT):
                continue
            exec(code, namespace)


def test_readme_snippets_build():
    """Each family's README snippet names a registered type with valid arguments (built at the
    test size, without its checkpoint)."""
    import amvim_mm  # noqa: F401
    from amvim_mm.registry import MODELS
    built = set()
    for i, block in enumerate(_blocks(_read(README), 'python')):
        namespace = {}
        exec(compile(block, f'README.md, python block {i + 1}', 'exec'), namespace)
        cfg = namespace.get('backbone') or namespace.get('model', {}).get('backbone')
        if cfg is None:
            continue
        cfg = {k: v for k, v in cfg.items()
               if k not in ('_delete_', 'init_cfg', 'img_size', 'out_indices')}
        MODELS.build(dict(cfg, arch='test', img_size=64))
        built.add(cfg['type'])
    assert built == {'Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba'}, built


# ------------------------------------------------------ names and numbers against the code
CONFIGS = osp.join(ROOT, 'configs')
#: records of what ran at the time keep the names they ran with: not checked
HISTORY = ('CHANGELOG.md', osp.join('benchmarks', 'runs') + osp.sep)
MD_PAGES = sorted({p for pattern in ('*.md', 'docs/**/*.md', 'configs/**/*.md',
                                     'benchmarks/**/*.md', 'tools/**/*.md')
                   for p in glob(osp.join(ROOT, pattern), recursive=True)
                   if not osp.relpath(p, ROOT).startswith(HISTORY)})
CONFIG_FILES = sorted(osp.relpath(p, ROOT).replace(osp.sep, '/')
                      for p in glob(osp.join(CONFIGS, '**', '*.py'), recursive=True))
#: configs/<folder> that hold model configs named <folder>-<arch>_... (not _base_, deploy, demo)
FAMILIES = sorted(f for f in os.listdir(CONFIGS) if osp.isdir(osp.join(CONFIGS, f))
                  and f not in ('_base_', 'deploy', 'demo'))
#: a .py path or name, with shell braces ({a,b}), globs (*) and elisions (...)
PY_TOKEN = re.compile(r'(?<![\w./:{},*-])([\w./{},*-]*[\w}*]\.py)\b')
#: a config named without .py in backticks (tables of the configs/* READMEs)
CONFIG_NAME = re.compile(r'`((?:%s)-[\w{},*.-]*_\d+xb\d+-[\w{},*.-]*)(?<!\.py)`'
                         % '|'.join(FAMILIES))
NUMBER_WORDS = dict(one=1, two=2, three=3, four=4, five=5, six=6, seven=7, eight=8, nine=9,
                    ten=10)


def _expand(token):
    """Shell brace expansion; identical groups take the same choice
    (``configs/{vim,amvim}/{vim,amvim}-t_...``), ``{m}`` (no comma) is a placeholder."""
    m = re.search(r'\{([^{}]*)\}', token)
    if not m:
        return [token]
    choices = m.group(1).split(',') if ',' in m.group(1) else ['*']
    return [t for c in choices for t in _expand(token.replace(m.group(0), c))]


def _config_mentions(text):
    return ([m.group(1) for m in PY_TOKEN.finditer(text)]
            + [m.group(1) + '.py' for m in CONFIG_NAME.finditer(text)])


def _missing_configs(page, token):
    """None when ``token`` is not one of our configs; else its expansions that match no file:
    paths from ``configs/`` (or relative in a configs/* README), names ``<family>-...`` and
    globs over the names."""
    folder = osp.relpath(osp.dirname(page), ROOT).replace(osp.sep, '/')
    names = [osp.basename(c) for c in CONFIG_FILES]
    missing = []
    for name in _expand(token):
        name = name.replace('...', '*')
        if name.startswith('configs/'):
            pattern, pool = name, CONFIG_FILES
        elif name.startswith(('./', '../')):
            pattern, pool = ((osp.normpath(osp.join(folder, name)), CONFIG_FILES)
                             if folder.startswith('configs') else (osp.basename(name), names))
        elif '/' in name:
            return None            # another repository's or library's file
        elif name.startswith(tuple(f'{f}-' for f in FAMILIES)) or name.startswith('*'):
            pattern, pool = name, names
        else:
            return None
        if not fnmatch.filter(pool, pattern):
            missing.append(name)
    return missing


def test_every_config_a_page_names_exists():
    missing, checked = [], 0
    for page in MD_PAGES:
        for token in _config_mentions(_read(page)):
            gone = _missing_configs(page, token)
            checked += gone is not None
            if gone:
                missing.append(f'{osp.relpath(page, ROOT)}: {token}')
    assert checked > 100, f'only {checked} config names found: is the pattern still right?'
    assert not missing, 'pages name configs that do not exist:\n' + '\n'.join(missing)


def test_every_config_folder_has_a_readme_in_the_docs_index():
    index = _read(osp.join(ROOT, 'docs', 'README.md'))
    linked = {osp.normpath(osp.join(ROOT, 'docs', t.split('#', 1)[0]))
              for t in LINK.findall(index)}
    folders = sorted(f for f in os.listdir(CONFIGS)
                     if osp.isdir(osp.join(CONFIGS, f)) and f != '_base_')
    no_readme = [f for f in folders if not osp.isfile(osp.join(CONFIGS, f, 'README.md'))]
    assert not no_readme, f'configs/ folders without a README.md: {no_readme}'
    unlinked = [f for f in folders if osp.join(CONFIGS, f, 'README.md') not in linked]
    assert not unlinked, f'docs/README.md does not link configs/{{{",".join(unlinked)}}}/README.md'


def _flat(path):
    return ' '.join(_read(osp.join(ROOT, path)).split())


def _demo_tool():
    spec = importlib.util.spec_from_file_location('_docs_demo', osp.join(ROOT, 'tools', 'demo.py'))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)     # constants only at import: no amvim_mm, no torch
    return demo


def _count(word):
    return int(word) if word.isdigit() else NUMBER_WORDS[word.lower()]


def test_shipped_checkpoint_count_is_that_of_sha256sums():
    sums = [ln for ln in _read(osp.join(ROOT, 'checkpoints', 'demo', 'SHA256SUMS')).splitlines()
            if ln.strip() and not ln.startswith('#')]
    stated = [int(n) for n in re.findall(r'\b(\d+) shipped checkpoints',
                                         _flat('configs/demo/README.md'))]
    assert stated, 'configs/demo/README.md states no "N shipped checkpoints"'
    assert set(stated) == {len(sums)}, (stated, f'{len(sums)} entries in SHA256SUMS')


def test_demo_checkpoint_and_seed_counts_are_those_of_the_demo():
    """The demo's checkpoint count and training seeds, wherever a page or the tool's docstring
    states them, are those of ``tools/demo.py``'s ``TASKS`` and ``SEEDS``."""
    demo = _demo_tool()
    seeds = {t: len(s) for t, s in demo.SEEDS.items()}
    n_ckpts = sum(len(models) * seeds[t] for t, (*_, models) in demo.TASKS.items())
    count_patterns = [r'(\d+) (?:verified )?checkpoints in `checkpoints/demo`',
                      r"the demo's (\d+)\b", r'\bthe (\d+) demo checkpoints',
                      r'retrain all (\d+)\b']
    seed_patterns = [r'(\w+) training seeds each for segmentation, (\w+) for detection and '
                     r'classification',
                     r'each segmentation model is trained with (\w+) seeds, each detection and '
                     r'classification model with (\w+)']
    counts, seed_statements, ranges = [], [], []
    for path in ('README.md', 'docs/demo.md', 'configs/demo/README.md', 'tools/demo.py'):
        text = _flat(path)
        counts += [(path, int(n)) for p in count_patterns for n in re.findall(p, text)]
        seed_statements += [(path, _count(a), _count(b)) for p in seed_patterns
                            for a, b in re.findall(p, text)]
        ranges += [(path, tuple(map(int, r))) for r in re.findall(
            r'`randomness\.seed` (\d+)-(\d+) for segmentation, (\d+)-(\d+) for detection and '
            r'classification', text)]
    assert counts and seed_statements, 'no page states the demo\'s checkpoints and seeds'
    assert all(n == n_ckpts for _, n in counts), (counts, f'tools/demo.py: {n_ckpts}')
    want = (seeds['segmentation'], seeds['detection'])
    assert seeds['detection'] == seeds['classification']
    assert all(s[1:] == want for s in seed_statements), (seed_statements, demo.SEEDS)
    seg, det = demo.SEEDS['segmentation'], demo.SEEDS['detection']
    want_ranges = (seg[0], seg[-1], det[0], det[-1])
    assert all(r == want_ranges for _, r in ranges), (ranges, demo.SEEDS)


def _per_cell_table(text, heading):
    """The rows of the 'Per cell:' table under ``heading`` in docs/demo.md: header, rows."""
    section = text[text.index(heading):]
    lines = section[section.index('Per cell:'):].splitlines()[2:]
    table = [[c.strip() for c in line.strip('|').split('|')]
             for line in itertools.takewhile(lambda s: s.startswith('|'), lines)]
    return table[0], table[2:]


@pytest.mark.parametrize('task,heading', [('segmentation', 'Segmentation ('),
                                          ('detection', 'Detection ('),
                                          ('classification', 'Classification (')])
def test_the_demo_plots_in_docs_come_from_the_run_demo_md_reports(task, heading):
    """docs/demo_<task>.png carry what they draw (a PNG text chunk): the demo's architectures
    with one thin line per training seed, and every drawn mean equal to docs/demo.md's
    per-cell table, i.e. the plot and the tables come from the same run and that run had the
    demo's present seeds."""
    from amvim_mm.apis.sweep import drawn
    demo = _demo_tool()
    plot = drawn(osp.join(ROOT, 'docs', f'demo_{task}.png'))
    assert plot['kind'] == 'per architecture'
    archs = [name for name, _ in demo.TASKS[task][4]]
    assert {line['label'].split(' / ')[0] for line in plot['lines']} == set(archs)
    for line in plot['lines']:
        assert len(line['models']) == len(demo.SEEDS[task]), line['label']
    head, rows = _per_cell_table(_read(osp.join(ROOT, 'docs', 'demo.md')), heading)
    tol = 6e-4 if task == 'detection' else 6e-3
    checked = 0
    for line in plot['lines']:
        arch, method = line['label'].split(' / ')
        col = next(i for i, h in enumerate(head) if h.startswith(f'{arch} ') and '[95% CI]' in h)
        for x, y in zip(line['x'], line['y'], strict=True):
            row = next(r for r in rows if float(r[2]) == pytest.approx(x, abs=6e-4)
                       and r[0] in (method, 'none'))
            assert float(row[col].split()[0]) == pytest.approx(y, abs=tol), (line['label'], x)
            checked += 1
    assert checked >= len(archs) * 4 * 3
