"""The chunked fused scan (amvim_mm.ops.fused_mixer: ``launch_scan`` with a chunk length,
``chunk_initial_states``) against a plain sequential PyTorch loop, the sequential fused kernel
and the unfused mixer; ToP's hidden-state alignment (``gaps``) and importance score in both
scans (``fused_mixer_forward``) against ``aligned_selective_scan``; and the automatic choice of
the scan (amvim_mm.ops.scan_choice: ``SCAN_CHOICE_TABLE`` and its fallback rule).

On CPU the kernels run in Triton's interpreter, switched on before Python starts, so those
checks run in a subprocess with ``TRITON_INTERPRET=1`` (tiny sizes: E = 16, N = 4-8, L <= 37).
The GPU checks compile them.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.models.execution import Choice
from amvim_mm.ops import fused_mixer as FM
from amvim_mm.ops import scan_choice as SC
from amvim_mm.testing.triton_interpreter import PREAMBLE as FAST_INTERPRETER
from tests.ops.triton_support import HAS_TRITON, needs_triton  # noqa: F401

#: the fused mixer's route, given to a direct mixer call
TRITON_ROUTE = Choice('triton', 'test')


# the reference: the scan of every path as a float64 loop over the steps, the state before
# every step, and the gated outputs scattered into token order
REFERENCE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    def reference_scan(xc, x_dbl, delta, dtb, A, D, z, perm, R):
        P, B, L, E = xc.shape
        N = A.shape[-1]
        perm = perm.long().expand(P, B, L)
        dt = F.softplus(delta.double() + dtb.double()[:, None, None])
        u, A = xc.double(), A.double()[:, None]
        h = torch.zeros(P, B, E, N, dtype=torch.float64)
        before, y = [], torch.zeros(B, L, P * E, dtype=torch.float64)
        for i in range(L):
            before.append(h)
            bi = x_dbl[:, :, i, R:R + N].double()
            ci = x_dbl[:, :, i, R + N:R + 2 * N].double()
            h = torch.exp(dt[:, :, i, :, None] * A) * h + (dt[:, :, i] * u[:, :, i])[..., None] \\
                * bi[:, :, None]
            yi = (h * ci[:, :, None]).sum(-1) + D.double()[:, None] * u[:, :, i]
            for p in range(P):
                for b in range(B):
                    t = perm[p, b, i]
                    g = z[b, t].double()
                    y[b, t, p * E:(p + 1) * E] = yi[p, b] * g * torch.sigmoid(g)
        return torch.stack(before, 2), y
''')

INTERPRETER_SCRIPT = REFERENCE + textwrap.dedent('''
    import json
    from amvim_mm import runtime
    from amvim_mm.models.vim.mixer import BiMambaMixer
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.layout.scan_orders import normalize_order
    from amvim_mm.ops import fused_mixer as FM
    from amvim_mm.models.execution import Choice
    TRITON_ROUTE, TORCH_ROUTE = Choice('triton', 'test'), Choice('torch', 'test')

    def rel(a, b):
        return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

    # kernel level: (B, L, perm kind, chunk lengths); 8, 13, 16, 7 and 5 do not divide L,
    # 64 > L, T = 1 (a chunk a step), T = L (one chunk)
    kernel = []
    for B, L, kind, chunks in [(1, 37, 'flip', (8, 13, 64)), (2, 30, 'random', (16, 7, 1)),
                               (2, 23, 'random', (5, 23))]:
        torch.manual_seed(B * 100 + L)
        P, E, N, R = 2, 16, 4, 8
        xc = torch.randn(P, B, L, E)
        x_dbl = torch.randn(P, B, L, R + 2 * N + 4)    # B at column R, C at R + N, padding
        delta = torch.randn(P, B, L, E) * 0.7
        dtb = torch.randn(P, E) * 0.5 - 1.
        A = -(torch.rand(P, E, N) * 2 + 0.1)
        D = torch.randn(P, E)
        xz = torch.randn(B, L, 2 * E)
        z = xz[..., E:]                                # strided, as the mixer passes it
        if kind == 'flip':
            perm = torch.stack([torch.arange(L), torch.arange(L).flip(0)])[:, None]
        else:
            perm = torch.stack([torch.stack([torch.randperm(L) for _ in range(B)])
                                for _ in range(P)])
        perm = perm.to(torch.int32)
        before, y_ref = reference_scan(xc, x_dbl, delta, dtb, A, D, z, perm, R)
        wdt = torch.randn(P, E, R)                     # unused: delta is given
        y_seq = torch.empty(B, L, P * E)
        FM.launch_scan(xc, x_dbl, delta, z, perm, wdt, dtb, A, D, y_seq, chunk=0)
        for T in chunks:
            states = FM.chunk_initial_states(xc, x_dbl, delta, dtb, A, R, T)
            want = before[:, :, ::T]
            y = torch.full((B, L, P * E), float('nan'))
            FM.launch_scan(xc, x_dbl, delta, z, perm, wdt, dtb, A, D, y, chunk=T)
            kernel.append(dict(
                case=[B, L, kind, T], shape=list(states.shape),
                want_shape=[P, B, -(-L // T), E, N], dtype=str(states.dtype),
                states=((states.double() - want).abs().max() / before.abs().max()).item(),
                chunk0_zero=bool((states[:, :, 0] == 0).all()),
                # how much state crosses the chunk boundaries (the carry must matter)
                boundary=(before[:, :, T::T].abs().max() / before.abs().max()).item()
                if T < L else None,
                y_ref=rel(y, y_ref), y_seq=rel(y, y_seq), seq_ref=rel(y_seq, y_ref)))

    # model level: BiMambaMixer fused (sequential, chunked) against unfused, fp32
    model = []
    window = dict(order='window', size=2, inner='col', reverse=True)
    # 31-37 tokens: chunks of 8 and 11 give 4-5 chunks, the last one partial
    for B, grid, cls, reduced, paths in [
            (1, (5, 7), 17, False, [dict(order='raster'), window]),
            (2, (6, 6), 18, False, [window, dict(order='raster', reverse=True)]),
            (2, (6, 7), 15, True, [dict(order='raster'), dict(window, size=3)])]:
        torch.manual_seed(B + grid[0])
        # E = 16, N = 8, R = 1 (padded to 8); Mamba's init: step sizes 0.001-0.1, so the
        # state carries over many steps (across chunks)
        mixer = BiMambaMixer(8, d_state=8).eval()
        keys = tuple(normalize_order(p) for p in paths)
        if reduced:   # per-sample token sets: (P, B, L) path indices
            M, keep = grid[0] * grid[1], 30
            pos = torch.stack([torch.sort(torch.randperm(M)[:keep]).values for _ in range(B)])
            pos = torch.cat([pos[:, :cls], torch.full((B, 1), -1), pos[:, cls:]], 1)
            ctx = ScanContext(grid, cls_index=cls, pos=pos, n_patches=keep)
        else:
            ctx = ScanContext(grid, cls_index=cls)
        L = ctx.pos.shape[-1]
        h = torch.randn(B, L, 8)
        perms = ctx.path_perms(keys)
        with torch.no_grad():
            ref = mixer(h, ctx, keys, route=TORCH_ROUTE)
            outs = {}
            for T in (0, 8, 11, 128):
                with runtime.override(scan_chunk=T):
                    outs[T] = mixer(h, ctx, keys, route=TRITON_ROUTE)
            auto = mixer(h, ctx, keys, route=TRITON_ROUTE)    # automatic: L < 512, sequential
        model.append(dict(case=[B, L, reduced], perm_shape=list(perms.shape),
                          not_identity=[not torch.equal(perms[p, 0].long(), torch.arange(L))
                                        for p in range(2)],
                          unfused={T: rel(o, ref) for T, o in outs.items()},
                          seq={T: rel(o, outs[0]) for T, o in outs.items()},
                          auto_equal=torch.equal(auto, outs[0])))

    # ToP's hidden-state alignment and importance in fused_mixer_forward (sequential and chunked
    # scans) against an independent PyTorch reference: per path gather, conv + silu, x_proj,
    # dt_proj, aligned_selective_scan (torch backend), scatter into token order, mean, out_proj
    from amvim_mm.ops.selective_scan import aligned_selective_scan

    def reference_mixer(h, w, perm, gaps, mode):
        in_w, out_w, conv_w, conv_b, xp_w, dt_w, dt_b, A, D = w
        P, E, K = conv_w.shape
        Bn, L, _ = h.shape
        R, N = dt_w.shape[-1], A.shape[-1]
        xz = h @ in_w.t()
        ys = []
        for p in range(P):
            idx = perm[p].long().expand(Bn, L)[..., None].expand(Bn, L, 2 * E)
            x, z = xz.gather(1, idx).transpose(1, 2).chunk(2, 1)        # (B, E, L) path order
            x = F.silu(F.conv1d(x, conv_w[p, :, None], conv_b[p], padding=K - 1, groups=E)
                       [..., :L])
            x_dbl = x.transpose(1, 2) @ xp_w[p].t()                      # (B, L, R + 2N)
            dt = (x_dbl[..., :R] @ dt_w[p].t()).transpose(1, 2)          # (B, E, L)
            Bm, Cm = (x_dbl[..., R + i * N:R + (i + 1) * N].transpose(1, 2) for i in (0, 1))
            gd = None
            if gaps is not None:
                step = F.softplus(dt_b[p])[None, :, None] if mode == 'bias' else \\
                    F.softplus(dt + dt_b[p][None, :, None])
                gd = gaps[p].expand(Bn, L)[:, None] * step
            y = aligned_selective_scan(x, dt, A[p], Bm, Cm, D[p], z, delta_bias=dt_b[p],
                                       gap_delta=gd, backend='torch')
            ys.append(torch.zeros(Bn, L, E).scatter(
                1, perm[p].long().expand(Bn, L)[..., None].expand(Bn, L, E), y.transpose(1, 2)))
        imp = sum(y.clamp_min(0).sum(-1) for y in ys)
        return (sum(ys) / P) @ out_w.t(), imp

    torch.manual_seed(5)
    P, Bn, L, Dm, E, K, N, R = 2, 2, 29, 8, 16, 4, 8, 3
    w = (torch.randn(2 * E, Dm) * 0.4, torch.randn(Dm, E) * 0.3, torch.randn(P, E, K) * 0.5,
         torch.randn(P, E) * 0.2, torch.randn(P, R + 2 * N, E) * 0.3, torch.randn(P, E, R) * 0.5,
         torch.randn(P, E) * 0.5 - 1., -(torch.rand(P, E, N) * 1.5 + 0.1), torch.randn(P, E))
    h = torch.randn(Bn, L, Dm)
    perm = torch.stack([torch.stack([torch.randperm(L) for _ in range(Bn)]) for _ in range(P)])
    perm = perm.to(torch.int32)
    gaps = torch.randint(0, 4, (P, Bn, L)).to(torch.float16)      # any float dtype
    gap_res, plains = [], {}
    nogap, _ = reference_mixer(h, w, perm, None, 'bias')
    for mode in ('bias', 'token'):
        ref, ref_imp = reference_mixer(h, w, perm, gaps, mode)
        # sequential; chunks of 8 (4 chunks, the last one short); sequential, dt_proj in it
        for T, cfg in ((0, None), (8, None), (0, '16,1,1')):
            with runtime.override(scan_config=cfg):
                out, imp = FM.fused_mixer_forward(h, *w, perm, chunk=T, gaps=gaps,
                                                  gap_delta=mode, importance=True)
                if (T, cfg) not in plains:      # no gaps: the same in both modes
                    plains[T, cfg] = FM.fused_mixer_forward(h, *w, perm, chunk=T)
                plain = plains[T, cfg]
                zero = FM.fused_mixer_forward(h, *w, perm, chunk=T, gaps=torch.zeros(P, Bn, L),
                                              gap_delta=mode)
            gap_res.append(dict(case=[mode, T, cfg], out=rel(out, ref), imp=rel(imp, ref_imp),
                                imp_dtype=str(imp.dtype), imp_shape=list(imp.shape),
                                plain=rel(plain, nogap), zero_equal=torch.equal(zero, plain),
                                gap_effect=rel(ref, nogap)))
    print('RESULT' + json.dumps(dict(kernel=kernel, model=model, gaps=gap_res)))
''')


@needs_triton
def test_chunked_scan_matches_references_in_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    for var in ('AMVIM_FUSED_SCAN_CONFIG', 'AMVIM_FUSED_SCAN_CHUNK'):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + INTERPRETER_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    out = json.loads(line[len('RESULT'):])
    assert len(out['kernel']) == 8
    for r in out['kernel']:
        assert r['shape'] == r['want_shape'] and r['dtype'] == 'torch.float32', r
        assert r['chunk0_zero'], r
        assert r['boundary'] is None or r['boundary'] > 0.1, r
        assert r['states'] < 1e-5, r
        assert r['y_ref'] < 1e-5 and r['y_seq'] < 1e-5 and r['seq_ref'] < 1e-5, r
    assert len(out['model']) == 3
    for r in out['model']:
        assert any(r['not_identity']), r     # a real permutation (window path) was walked
        assert set(r['unfused']) == {'0', '8', '11', '128'}, r
        for T in r['unfused']:
            assert r['unfused'][T] < 1e-5 and r['seq'][T] < 1e-5, (T, r)
        assert r['auto_equal'], r
    assert out['model'][2]['perm_shape'] == [2, 2, 31]     # per-sample (reduced) paths
    assert out['model'][0]['perm_shape'] == [2, 1, 36]
    # ToP's alignment (gap_delta 'bias' / 'token', sequential / chunked) and importance
    assert [r['case'] for r in out['gaps']] == [
        [mode, T, cfg] for mode in ('bias', 'token')
        for T, cfg in ((0, None), (8, None), (0, '16,1,1'))]
    for r in out['gaps']:
        assert r['gap_effect'] > 0.05, r     # the gaps change the output: they were applied
        assert r['out'] < 1e-5 and r['imp'] < 1e-5 and r['plain'] < 1e-5, r
        assert r['imp_dtype'] == 'torch.float32' and r['imp_shape'] == [2, 29], r
        assert r['zero_equal'], r            # zero gaps: bit for bit the no-gap kernels


# ------------------------------------------------------------------- the automatic choice
@pytest.fixture(autouse=True)
def _default_scan_settings(monkeypatch):
    """The module defaults (no launch configuration or chunk forced by the environment)."""
    for var in ('AMVIM_FUSED_SCAN_CONFIG', 'AMVIM_FUSED_SCAN_CHUNK'):
        monkeypatch.delenv(var, raising=False)


def test_auto_choice_chunks_long_small_batches_and_walks_short_large_ones():
    assert SC.auto_scan_choice(1, 384, 4097, 2, True).startswith('chunk')
    assert SC.auto_scan_chunk(1, 384, 4097, 2) in SC.CHUNK_SIZES
    assert SC.auto_scan_choice(128, 384, 197, 2, True) == 'seq'
    assert SC.auto_scan_chunk(128, 384, 197, 2) == 0
    # the segmentation shape (512 px, batch 8): chunked; the measured table (run 37, graph
    # mode) chunks even 197 tokens below batch 32, and walks them from batch 32 on
    assert SC.auto_scan_chunk(8, 384, 1025, 2) > 0
    assert SC.auto_scan_chunk(1, 384, 197, 2) == 32
    assert SC.auto_scan_chunk(32, 384, 197, 2) == 0


def test_fallback_rule_counts_programs():
    # E = 384, BLOCK_E = 64: 6 channel blocks; 2 paths -> 12 programs a sample
    assert SC.rule_scan_choice(44, 384, 1025, 2) == 'seq'        # 528 programs: enough
    assert SC.rule_scan_choice(43, 384, 1025, 2) == 'chunk256'   # 516 x 5 chunks
    assert SC.rule_scan_choice(1, 384, 4097, 2) == 'chunk64'     # 12 x 65 = 780 >= 528
    assert SC.rule_scan_choice(1, 384, 1025, 2) == 'chunk32'     # 12 x 33 < 528: smallest T
    assert SC.rule_scan_choice(1, 384, 511, 2) == 'seq'          # too short to chunk
    assert SC.rule_scan_choice(1, 384, 4097, 4) == 'chunk128'    # 24 x 33 = 792


def test_table_lookup_nearest_bucket_and_fallback(monkeypatch):
    table = {(384, 197): {1: 'mamba', 8: 'seq', 128: 'seq'},
             (384, 1025): {1: 'chunk32', 8: 'chunk128', 128: 'seq'},
             (384, 4097): {1: 'chunk64', 8: 'mamba', 128: 'seq'}}
    monkeypatch.setattr(SC, 'SCAN_CHOICE_TABLE', table)
    assert SC.table_scan_choice(1, 384, 197) == 'mamba'
    assert SC.table_scan_choice(6, 384, 1100) == 'chunk128'    # nearest L 1025, batch 8
    assert SC.table_scan_choice(2, 384, 1100) == 'chunk32'     # batch 2: nearer 1 than 8
    assert SC.table_scan_choice(3, 384, 4097) == 'mamba'       # log-nearest of 1 and 8: 8
    assert SC.table_scan_choice(6, 384, 2600) == 'mamba'       # L 2600: nearer 4097 (log)
    # outside: other width, other path count, L or batch beyond a factor 2 of the table
    assert SC.table_scan_choice(8, 768, 1025) is None
    assert SC.table_scan_choice(8, 384, 1025, num_paths=4) is None
    assert SC.table_scan_choice(8, 384, 9000) is None and SC.table_scan_choice(8, 384, 90) is None
    assert SC.table_scan_choice(300, 384, 1025) is None
    # 'mamba' only with the kernel; else, and outside the table, the rule
    assert SC.auto_scan_choice(8, 384, 4097, 2, True) == 'mamba'
    assert SC.auto_scan_choice(8, 384, 4097, 2, False) == SC.rule_scan_choice(8, 384, 4097)
    assert SC.auto_scan_choice(8, 768, 4097, 2, True) == SC.rule_scan_choice(8, 768, 4097)
    assert not SC.auto_prefers_fused(8, 384, True, 4097)
    assert SC.auto_prefers_fused(8, 384, False, 4097)
    assert SC.auto_prefers_fused(8, 384, True, 1025)
    # launch_scan's automatic chunk: a 'mamba' entry counts as the rule's fused choice
    assert SC.auto_scan_chunk(8, 384, 4097, 2) == SC.choice_chunk(
        SC.rule_scan_choice(8, 384, 4097))
    assert SC.auto_scan_chunk(6, 384, 1100, 2) == 128


def test_choice_table_entries():
    """E = 384: the run-37 measurement (the fused scans beat mamba-ssm everywhere); E = 768,
    not measured yet: the fallback rule's choice at every point. No entry names mamba-ssm,
    every chunk length is one the kernels were timed with."""
    for (E, L), row in SC.SCAN_CHOICE_TABLE.items():
        assert L in (197, 1025, 2305, 4097)
        for batch, choice in row.items():
            assert choice == 'seq' or SC.choice_chunk(choice) in SC.CHUNK_SIZES, choice
            if E == 768:
                assert choice == SC.rule_scan_choice(batch, E, L, 2), (E, L, batch)
    assert SC.SCAN_CHOICE_TABLE[(384, 1025)][8] == 'chunk32'
    assert {E for E, _ in SC.SCAN_CHOICE_TABLE} == {384, 768}


def test_scan_chunk_setting_and_dt_in_kernel(monkeypatch):
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CHUNK', '0')
    assert SC.auto_scan_chunk(1, 384, 4097, 2) == 0
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CHUNK', '96')
    assert SC.auto_scan_chunk(128, 384, 197, 2) == 96
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CHUNK', 'auto')
    assert SC.auto_scan_chunk(1, 384, 4097, 2) == 64
    with runtime.override(scan_chunk=32):
        assert SC.auto_scan_chunk(1, 384, 4097, 2) == 32
    with runtime.override(scan_config='64,2,1'):     # dt_proj in the kernel: not chunked
        assert SC.auto_scan_chunk(1, 384, 4097, 2) == 0
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CHUNK', '-4')
    with pytest.raises(ConfigError, match='AMVIM_FUSED_SCAN_CHUNK=.-4.: use auto, 0'):
        runtime.settings()


@needs_triton
def test_chunked_scan_refuses_dt_in_kernel_and_bad_chunks():
    P, B, L, E, N, R = 2, 1, 10, 16, 4, 8
    xc, delta = torch.zeros(P, B, L, E), torch.zeros(P, B, L, E)
    x_dbl = torch.zeros(P, B, L, R + 2 * N)
    A, bias = -torch.ones(P, E, N), torch.zeros(P, E)
    y = torch.empty(B, L, P * E)
    with runtime.override(scan_config='16,1,1'), pytest.raises(ConfigError, match='chunked'):
        FM.launch_scan(xc, x_dbl, delta, xc[0], torch.zeros(P, 1, L, dtype=torch.int32),
                       torch.zeros(P, E, R), bias, A, bias, y, chunk=4)
    with pytest.raises(ConfigError, match='chunk must be >= 1'):
        FM.chunk_initial_states(xc, x_dbl, delta, bias, A, R, 0)
    with pytest.raises(ConfigError, match='x_dbl must be'):
        FM.chunk_initial_states(xc, x_dbl[..., :R + N], delta, bias, A, R, 4)


@needs_triton
def test_gap_arguments_are_checked():
    """ToP's gaps must be (P, B or 1, L) and gap_delta 'bias' or 'token' (checked before any
    kernel runs)."""
    P, B, L, E, N, R, Dm = 2, 3, 10, 16, 4, 8, 8
    xc, delta = torch.zeros(P, B, L, E), torch.zeros(P, B, L, E)
    x_dbl = torch.zeros(P, B, L, R + 2 * N)
    A, bias = -torch.ones(P, E, N), torch.zeros(P, E)
    perm = torch.arange(L, dtype=torch.int32).expand(P, 1, L)
    with pytest.raises(ConfigError, match=r'gaps must have shape \(P=2, 1 or B=3, L=10\); '
                                          r'got \(2, 2, 10\)'):
        FM.launch_scan(xc, x_dbl, delta, xc[0], perm, torch.zeros(P, E, R), bias, A, bias,
                       torch.empty(B, L, P * E), chunk=0, gaps=torch.zeros(P, 2, L))
    with pytest.raises(ConfigError, match='gaps must have shape'):
        FM.chunk_initial_states(xc, x_dbl, delta, bias, A, R, 4, gaps=torch.zeros(P, L))
    w = (torch.zeros(2 * E, Dm), torch.zeros(Dm, E), torch.zeros(P, E, 4), bias,
         torch.zeros(P, R + 2 * N, E), torch.zeros(P, E, R), bias, A, bias)
    h = torch.zeros(B, L, Dm)
    with pytest.raises(ConfigError, match="gap_delta must be 'bias' or 'token'; got 'mean'"):
        FM.fused_mixer_forward(h, *w, perm, gap_delta='mean')
    with pytest.raises(ConfigError, match='gaps must have shape'):
        FM.fused_mixer_forward(h, *w, perm, gaps=torch.zeros(P, B, L + 1))


def test_backbone_asks_with_the_token_count():
    """The fused-path decision taken once per forward on the images passes the number of
    tokens (patches + class token) on to the automatic choice."""
    from amvim_mm.registry import MODELS
    seen = []
    for cls in (True, False):
        m = MODELS.build(dict(type='Vim', arch='test', img_size=64, with_cls_token=cls,
                              out_type='featmap')).eval()
        seen.append(m.execution_plan(torch.randn(2, 3, 64, 48)).facts.tokens)
        p = m.patch_embed.patch_size       # stride p: ceil(side / p) patches a side
        assert seen[-1] == -(-64 // p) * -(-48 // p) + cls


def test_scan_choice_table_from_timings_and_literal():
    from typing import Dict, Tuple

    from amvim_mm.bench.measure import format_scan_choice_table, scan_choice_table
    variants = ['seq', 'chunk32', 'chunk64', 'mamba']
    rows = [dict(E=384, L=197, batch=1, seq=10.0, chunk32=12.0, chunk64=11.0, mamba=9.5),
            dict(E=384, L=197, batch=128, seq=100.0, chunk32=150.0, chunk64=None, mamba=None),
            dict(E=768, L=4097, batch=2, seq=900.0, chunk32=300.0, chunk64=300.0, mamba=400.0),
            dict(E=768, L=4097, batch=128, seq=None, chunk32=None, chunk64=None, mamba=None)]
    table = scan_choice_table(rows, variants)
    assert table == {(384, 197): {1: 'mamba', 128: 'seq'}, (768, 4097): {2: 'chunk32'}}
    text = format_scan_choice_table(table)
    ns = dict(Dict=Dict, Tuple=Tuple)
    exec(text, ns)
    assert ns['SCAN_CHOICE_TABLE'] == table
    assert max(len(x) for x in text.splitlines()) <= 100


# ------------------------------------------------------------------------------------- GPU
def gpu(fn):
    """GPU test: marked ``gpu`` and skipped with the reason where CUDA is absent."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')(fn)
    return pytest.mark.gpu(fn)


def _rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _dense_mixer():
    from amvim_mm.models.vim.mixer import BiMambaMixer
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.layout.scan_orders import normalize_order
    torch.manual_seed(0)
    mixer = BiMambaMixer(192).cuda().eval()                  # E = 384, N = 16
    keys = tuple(normalize_order(p) for p in (dict(order='raster'),
                                              dict(order='raster', reverse=True)))
    ctx = ScanContext((32, 32), cls_index=512, device='cuda')   # L = 1025
    return mixer, keys, ctx


@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@gpu
def test_gpu_chunked_matches_sequential(dtype):
    mixer, keys, ctx = _dense_mixer()
    h = torch.randn(2, 1025, 192, device='cuda')
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    outs = {}
    try:
        for T in (0, 64, 100, 256):
            with torch.no_grad(), runtime.override(scan_chunk=T), torch.autocast(
                    'cuda', dtype=dtype or torch.float32, enabled=dtype is not None):
                outs[T] = mixer(h, ctx, keys, route=TRITON_ROUTE)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    for T in (64, 100, 256):
        a, b = outs[T], outs[0]
        assert a.shape == b.shape == (2, 1025, 192) and a.dtype == b.dtype
        assert torch.isfinite(a).all()
        if dtype is None:
            assert _rel(a, b) < 1e-4, T
        else:   # same fp32 states; the bf16 rounding of y may differ by one step
            assert _rel(a, b) < 1e-2, T
            assert (a.float() - b.float()).abs().mean() < 1e-3 * b.float().abs().mean(), T


@gpu
def test_gpu_chunk_initial_states_match_a_loop_and_graph_capture():
    from amvim_mm.bench.measure import eager_and_replayed
    torch.manual_seed(1)
    P, B, L, E, N, R = 2, 2, 1025, 384, 16, 16
    dev = 'cuda'
    xc = torch.randn(P, B, L, E, device=dev)
    x_dbl = torch.randn(P, B, L, R + 2 * N, device=dev)
    delta = torch.randn(P, B, L, E, device=dev) * 0.5
    dtb = torch.randn(P, E, device=dev) - 3.
    A = -torch.rand(P, E, N, device=dev) * 4 - 0.1
    dt = torch.nn.functional.softplus(delta + dtb[:, None, None])
    h = torch.zeros(P, B, E, N, device=dev)
    want = []
    for i in range(L):
        if i % 64 == 0:
            want.append(h)
        h = torch.exp(dt[:, :, i, :, None] * A[:, None]) * h + \
            (dt[:, :, i] * xc[:, :, i])[..., None] * x_dbl[:, :, i, None, R:R + N]
    want = torch.stack(want, 2)
    got = FM.chunk_initial_states(xc, x_dbl, delta, dtb, A, R, 64)
    assert got.shape == want.shape == (P, B, 17, E, N)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4
    # the chunked launch survives CUDA-graph capture (eager and replay agree)
    z = torch.randn(B, L, E, device=dev)
    perm = torch.stack([torch.arange(L), torch.arange(L).flip(0)])[:, None].to(dev)
    D = torch.randn(P, E, device=dev)
    y = torch.empty(B, L, P * E, device=dev)
    ref, out = eager_and_replayed(lambda: FM.launch_scan(
        xc, x_dbl, delta, z, perm, torch.zeros(P, E, R, device=dev), dtb, A, D, y, chunk=64))
    assert torch.equal(ref, out)


def test_export_softplus_equals_softplus():
    """The scan's step sizes while an export records: ``relu(x) + log(1 + exp(-|x|))`` (ONNX
    Runtime's Softplus kernel was slow) equals ``F.softplus`` to float rounding over the
    range step sizes take, extremes included (absolute error <= 1e-7 where exp underflows)."""
    import torch.nn.functional as F
    from amvim_mm import runtime
    from amvim_mm.ops.selective_scan import export_softplus
    x = torch.cat([torch.linspace(-40, 40, 20001), torch.tensor([0.0, -0.0, 1e-8, -1e-8])])
    ref = F.softplus(x.double())
    assert torch.equal(export_softplus(x), F.softplus(x))       # eager: PyTorch's own
    with runtime.frozen_for_export():
        got = export_softplus(x)
    err = (got.double() - ref).abs()
    assert (err <= 1e-7 + 2e-7 * ref.abs()).all(), err.max()
