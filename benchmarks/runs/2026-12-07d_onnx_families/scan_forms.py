"""One selective scan of Vim-T's shape (batch 1, E=384, N=16, L=192) in ONNX Runtime, 2 threads:
the project's chunked export form at three chunk lengths against a cumulative-sum form
(``h_t = exp(cum_t) * (h_0 + cumsum_s exp(-cum_s) * b_s)`` per chunk; not in the project: it
overflows in float32 once a chunk's summed log-decay passes about -88, which trained step
sizes can reach). A record for issue 55's note; run from the repository root:

    python benchmarks/runs/2026-12-07d_onnx_families/scan_forms.py
"""
import io
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F

from amvim_mm import runtime
from amvim_mm.ops.selective_scan import selective_scan_torch

E, L, N, REPEAT = 384, 192, 16, 8


def cumsum_scan(u, d, A, B, C, T):
    dt = F.softplus(d)
    b_, e_, l_ = u.shape
    nc = l_ // T
    cum = (dt.transpose(1, 2).reshape(b_, nc, T, e_, 1) * A).cumsum(2)
    bb = ((dt * u).transpose(1, 2).reshape(b_, nc, T, e_, 1)
          * B.transpose(1, 2).reshape(b_, nc, T, 1, N))
    loc = torch.exp(cum) * torch.cumsum(torch.exp(-cum) * bb, 2)
    p, hend = torch.exp(cum[:, :, -1]), loc[:, :, -1]
    hs, h = [], torch.zeros_like(hend[:, 0])
    for c in range(nc):
        hs.append(h)
        h = p[:, c] * h + hend[:, c]
    H = loc + torch.exp(cum) * torch.stack(hs, 1).unsqueeze(2)
    y = (H * C.transpose(1, 2).reshape(b_, nc, T, 1, N)).sum(-1)
    return y.reshape(b_, l_, e_).transpose(1, 2)


class Scans(torch.nn.Module):
    def __init__(self, form, chunk):
        super().__init__()
        self.form, self.chunk = form, chunk
        self.A = torch.nn.Parameter(-torch.arange(1, N + 1).float().repeat(E, 1))

    def forward(self, u, d, B, C):
        for _ in range(REPEAT):
            u = (selective_scan_torch(u, d, self.A, B, C, delta_softplus=True,
                                      chunk_size=self.chunk) if self.form == 'chunked'
                 else cumsum_scan(u, d, self.A, B, C, self.chunk))
        return u


def main():
    warnings.simplefilter('ignore')
    torch.manual_seed(0)
    torch.set_num_threads(2)
    args = (torch.randn(1, E, L), torch.randn(1, E, L) * 0.5 - 2, torch.randn(1, N, L),
            torch.randn(1, N, L))
    ref = Scans('chunked', None)(*args).detach().numpy()
    for form, chunk in [('chunked', 8), ('chunked', 16), ('chunked', 32), ('cumsum', 8),
                        ('cumsum', 16)]:
        f = io.BytesIO()
        with runtime.frozen_for_export(), torch.no_grad():
            torch.onnx.export(Scans(form, chunk), args, f, opset_version=17, dynamo=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.add_session_config_entry('session.intra_op.allow_spinning', '0')
        sess = ort.InferenceSession(f.getvalue(), so)
        feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        out = sess.run(None, feed)[0]
        err = np.abs(out - ref).max() / np.abs(ref).max()
        times = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(5):
                sess.run(None, feed)
            times.append((time.perf_counter() - t) / 5 / REPEAT * 1e3)
        nodes = len(onnx.load_from_string(f.getvalue()).graph.node) // REPEAT
        print(f'{form:8s} chunk {chunk:2d}: {np.median(times):.2f} ms per scan, '
              f'{nodes} nodes per scan, max rel. error {err:.1e}', flush=True)


if __name__ == '__main__':
    main()
