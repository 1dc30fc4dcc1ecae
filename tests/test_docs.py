"""The documentation keeps its promises: a short README whose two commands are the ones
``run.sh`` (and ``.ci/run``) accept, short recipes whose code runs, links that resolve, and a
docs index that names every page.

A ``python`` block of a ``docs/how_to_add_*.md`` recipe runs (the blocks of one page in order,
sharing their names, inside a scope that restores the registries afterwards); a block whose
first line is the comment ``# fragment`` (a piece of a larger file, e.g. with relative imports)
is only compiled.
"""
import contextlib
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
