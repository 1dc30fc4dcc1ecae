"""The interpreter shortcut of the parity tests (amvim_mm.testing.triton_interpreter): a kernel
calling helpers (ours and ``tl.sum``, which sees ``tl.core``) in a loop gives the same bits with
and without it, Triton's language walk runs once per launch and module set instead of at every
helper call, and a launch after another starts afresh."""
import json
import os
import subprocess
import sys
import textwrap

from tests.ops.triton_support import needs_triton

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch, triton, triton.language as tl
    from triton.runtime import interpreter
    if sys.argv[1] == '1':
        from amvim_mm.testing.triton_interpreter import install
        assert install() and install()          # idempotent
    walks = []
    original = interpreter._patch_builtin
    def counted(*a, **k):
        walks.append(1)
        return original(*a, **k)
    interpreter._patch_builtin = counted

    @triton.jit
    def softplus(x):
        return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))

    @triton.jit
    def kernel(x_ptr, out_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(STEPS):
            acc += softplus(x * (i + 1) * 0.1) + tl.sum(x, axis=0) * 0.01
        tl.store(out_ptr + offs, acc)

    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    outs = []
    for _ in range(2):                          # two launches
        out = torch.empty_like(x)
        kernel[(4, )](x, out, STEPS=12, BLOCK=16)
        outs.append(out.tolist())
    print('RESULT' + json.dumps(dict(outs=outs, walks=len(walks))))
''')


def _run(shortcut):
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', SCRIPT, '1' if shortcut else '0'], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    return json.loads(line[len('RESULT'):])


@needs_triton
def test_shortcut_gives_the_same_bits_with_fewer_language_walks():
    plain, fast = _run(False), _run(True)
    assert fast['outs'] == plain['outs'] and fast['outs'][0] == fast['outs'][1]
    # Triton: every helper call walks the language modules (4 programs x 12 steps x 2 helpers
    # x 2 launches); the shortcut: each launch once for tl, once more for tl.core (tl.sum)
    assert plain['walks'] >= 4 * 12 * 2 * 2
    assert fast['walks'] <= 2 * 2 * 5, fast['walks']
