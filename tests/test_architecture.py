"""The architecture's acceptance check (issue 36): sizes a reader can hold in mind, one protocol
for reducers, no run numbers in the library. Import cycles: ``test_structure.py``."""
import ast
import pathlib
import re

import amvim_mm

PACKAGE = pathlib.Path(amvim_mm.__file__).parent
REPO = PACKAGE.parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_README_LINES = 200


def _sources(*roots):
    for root in roots:
        yield from sorted((REPO / root).rglob('*.py'))


def _is_kernel_file(path: pathlib.Path) -> bool:
    """Triton kernels (``ops/_*_kernels.py``, undecorated so that Triton's interpreter runs
    them) are exempt from the function-length rule: a kernel is one launch."""
    return path.parent.name == 'ops' and path.name.startswith('_') and \
        path.name.endswith('_kernels.py')


def test_readme_is_short():
    n = len((REPO / 'README.md').read_text().splitlines())
    assert n <= MAX_README_LINES, f'README.md has {n} lines (at most {MAX_README_LINES})'


def test_no_module_over_the_limit():
    long = {str(p.relative_to(REPO)): n for p in _sources('amvim_mm')
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f'modules over {MAX_MODULE_LINES} lines: {long}'


def test_no_function_over_the_limit():
    long = []
    for path in _sources('amvim_mm', 'tools'):
        if _is_kernel_file(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f'{path.relative_to(REPO)}:{node.lineno} {node.name} ({n})')
    assert not long, f'functions over {MAX_FUNCTION_LINES} lines: {long}'


def test_reducers_declare_their_protocol():
    """``TokenReducer`` declares ``learned`` and ``dynamic``: nobody discovers them by
    ``getattr(..., 'learned' | 'dynamic', default)``."""
    found = []
    for path in _sources('amvim_mm', 'tools'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ('getattr', 'hasattr') and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and \
                    node.args[1].value in ('learned', 'dynamic'):
                found.append(f'{path.relative_to(REPO)}:{node.lineno}')
    assert not found, f'protocol discovered by getattr: {found}'
    from amvim_mm.models.reduction.reducers import TOKEN_REDUCERS, TokenReducer
    for name, cls in TOKEN_REDUCERS.module_dict.items():
        assert issubclass(cls, TokenReducer), name
        assert isinstance(cls.learned, bool) and isinstance(cls.dynamic, bool), name


#: measurements quoted in prose: "3.2x", "12 us", "0.4 ms", "0.45 s", "run 43", "runs 38 and
#: 40", "a fifth of", "several times faster"; they belong to benchmarks/README.md and
#: benchmarks/runs/, where the command that produced them is
RUN_NUMBER = re.compile(
    r'\b\d+(\.\d+)?x\b(?! ?\d)|\b\d+(\.\d+)? ?(us|µs|ms)\b|\b\d+\.\d+ s\b|\bruns? \d+\b'
    r'|\ba (fifth|third|quarter) of\b|\btimes (faster|slower)\b|\bTFLOP/s\b|\bGB/s\b')


def test_no_run_numbers_in_the_library():
    found = []
    for path in _sources('amvim_mm'):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            m = RUN_NUMBER.search(line)
            if m:
                found.append(f'{path.relative_to(REPO)}:{i}: {m.group(0)!r}')
    assert not found, 'run numbers in library comments (move them to benchmarks/README.md):\n' \
        + '\n'.join(found)


def test_the_run_number_pattern():
    hits = ['2.4x mamba-ssm', 'takes ~0.4 ms', '61.1 / 61.3 us', 'about 0.45 s of',
            'in run 37', 'in runs 38 and 40', 'about a fifth of an', 'several times faster']
    misses = ['a 2x2 grid', '(B, 2E, L)', 'a 1x1 conv', '64x64 images', 'benchmarks/runs/'
              '2026-12-01_run37', 'rms(x) over D', 'at 512 px, batch 8', 'stride 16']
    assert [h for h in hits if not RUN_NUMBER.search(h)] == []
    assert [m for m in misses if RUN_NUMBER.search(m)] == []


def test_one_arch_resolver():
    """Issue 53: every family resolves its ``arch`` through ``resolve_arch`` (one alias rule,
    one set of messages); no other module builds the alias map or the unknown-arch message."""
    from amvim_mm.models.skeleton import arch
    owners = sorted(str(p.relative_to(REPO)) for p in _sources('amvim_mm')
                    if 'arch {arch!r}; choose one of' in p.read_text())
    assert owners == ['amvim_mm/models/skeleton/arch.py'], owners
    calls = []
    for path in _sources('amvim_mm'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'resolve_arch':
                calls.append(path.name)
    assert sorted(calls) == ['family.py', 'plain_mamba.py', 'vil.py', 'vmamba.py'], calls
    # the one rule at work: case-insensitive names and aliases in every family
    from amvim_mm.models.plain_mamba.plain_mamba import _arch_settings as plain_arch
    from amvim_mm.models.vil.vil import _arch_settings as vil_arch
    from amvim_mm.models.vim.vim import VIM_ARCHS
    from amvim_mm.models.vim.family import _canonical_arch
    from amvim_mm.models.vmamba.vmamba import _arch_settings as vmamba_arch
    assert _canonical_arch(VIM_ARCHS, 'T', 'Vim') == _canonical_arch(VIM_ARCHS, 'tiny', 'Vim')
    assert plain_arch('L1') == plain_arch('l1') and vmamba_arch('Tiny') == vmamba_arch('t')
    assert vil_arch('TEST') == vil_arch('test')
    assert arch.resolve_arch('X', {'a': {}}, 'A', frozenset(), {}) == {}


def test_one_triton_loader():
    """Issue 53: the ops load their Triton kernels through ``ops/triton_loader.py`` alone (the
    ``triton.jit`` wrapping and the interpreter check were written seven times)."""
    found = sorted(str(p.relative_to(REPO)) for p in _sources('amvim_mm')
                   if ('triton.jit(' in p.read_text() or 'runtime.interpret' in p.read_text())
                   and p.name != 'triton_loader.py')
    assert found == [], found


FAMILIES = ('vim', 'vmamba', 'plain_mamba', 'vil')


def test_every_family_in_its_package():
    """Issue 53: ``models/backbones/`` only registers; each family is a package of its own that
    imports no other family (what they share is ``models/skeleton/``), and the skeleton imports
    no family."""
    models = PACKAGE / 'models'
    assert sorted(p.name for p in (models / 'backbones').iterdir()
                  if p.suffix == '.py') == ['__init__.py']
    crossing = []
    for pkg in FAMILIES + ('skeleton', ):
        for path in sorted((models / pkg).glob('*.py')):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom):
                    continue
                mod = node.module or ''
                parts = mod.split('.')
                target = parts[2] if mod.startswith('amvim_mm.models.') else \
                    parts[0] if node.level == 2 else None
                if target in FAMILIES and target != pkg:
                    crossing.append(f'{path.relative_to(REPO)}:{node.lineno} -> {target}')
    assert not crossing, crossing
    from amvim_mm.registry import MODELS
    for name in ('Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba', 'ViL', 'AMViL'):
        family = MODELS.get(name).__module__.split('.')[2]
        assert family in FAMILIES, (name, family)


def test_every_block_reports_its_facts():
    """Issue 53: every family's block reports its facts to the planner and the reduction
    session (``block_facts``); nobody probes for it with ``hasattr``."""
    from amvim_mm.models.execution import PlannedBlock
    from amvim_mm.models.vil.layer import ViLBlock, ViLBlockPair
    from amvim_mm.models.plain_mamba.block import PlainMambaLayer
    from amvim_mm.models.vim.block import VimBlock
    from amvim_mm.models.vmamba.blocks import VSSBlock
    for cls in (VimBlock, VSSBlock, PlainMambaLayer, ViLBlock, ViLBlockPair):
        assert issubclass(cls, PlannedBlock), cls
    probes = [str(p.relative_to(REPO)) for p in _sources('amvim_mm')
              if "'block_facts')" in p.read_text()]
    assert probes == [], probes


def test_a_block_without_facts_stops_in_one_line():
    """A family's block that is no ``PlannedBlock`` stops the forward's plan with one line (it
    used to be probed with ``hasattr`` and given default facts)."""
    import pytest
    import torch
    from torch import nn

    from amvim_mm.errors import ConfigError
    from amvim_mm.registry import MODELS
    m = MODELS.build(dict(type='PlainMamba', arch='test', img_size=64,
                          token_reduction=dict(type='ToMe', ratio=0.2))).eval()
    m.layers[1] = nn.Identity()
    with pytest.raises(ConfigError, match='Identity is a block of PlainMamba but no '
                                          'PlannedBlock') as err:
        m(torch.randn(1, 3, 64, 64))
    assert '\n' not in str(err.value)


def test_fused_is_a_build_argument_only():
    """Issue 53: no forward, route or call in the models takes ``fused=`` (a plan, a bool or
    None); the routes come as arguments (``route=``) from the forward's plan, and ``fused`` is
    the mixers' / backbones' build argument."""
    import ast
    bad = []
    for path in _sources('amvim_mm'):
        if 'execution' in path.parts:     # the planner's rules: the forward's Triton decision
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.name not in ('__init__', 'execution_plan', 'plan_vil',
                                          'plan_vmamba', 'plan_plain_mamba', 'plan_family') \
                    and 'fused' in [a.arg for a in node.args.args + node.args.kwonlyargs]:
                bad.append(f'{path.relative_to(REPO)}:{node.lineno} {node.name}')
            if isinstance(node, ast.Name) and node.id in ('as_plan', 'step_plan'):
                bad.append(f'{path.relative_to(REPO)}:{node.lineno} {node.id}')
            if isinstance(node, ast.Attribute) and node.attr == 'step_plan':
                bad.append(f'{path.relative_to(REPO)}:{node.lineno} .step_plan')
    assert bad == [], bad


def test_every_type_has_a_plan_that_names_every_block_and_step():
    """Issue 53: ``execution_plan(x).describe()`` names the route of every block and every
    reduction step for all seven backbone types (CPU inference, one ToMe step)."""
    import torch

    from amvim_mm.registry import MODELS
    cases = dict(Vim=dict(img_size=32, patch_size=8), AMVim=dict(img_size=32, patch_size=8),
                 LocalVim=dict(img_size=32, patch_size=8), PlainMamba=dict(img_size=64),
                 ViL=dict(img_size=64), AMViL=dict(img_size=64), VMamba=dict(img_size=64))
    for name, kw in cases.items():
        m = MODELS.build(dict(type=name, arch='test', token_reduction=dict(type='ToMe', r=1),
                              **kw)).eval()
        x = torch.randn(1, 3, kw['img_size'], kw['img_size'])
        with torch.no_grad():
            plan = m.execution_plan(x)
            m(x)
        text = plan.describe().splitlines()
        blocks = sum(len(stage) for stage in m.stages())
        assert plan.family == name and text[0].startswith(f'{name}: triton')
        assert sum(t.startswith('block ') for t in text) == blocks >= 2, name
        steps = [t for t in text if t.startswith('step before block')]
        assert len(steps) == len(plan.steps) >= 1, name
        assert len(m.last_context.steps) == len(plan.steps), name
        assert all(' (' in t for t in text[1:]), name      # every route says why
