"""An independent, slow statement of EViT's rule in a Vim (test ground truth).

EViT keeps the ``int(n * keep_rate)`` most important patch tokens after each block in
``locations`` and fuses the others into one token: the importance-weighted average of the
removed tokens' streams (together with the fused token itself, weighted by its own importance,
from the second step on). Every kept token reads the fused token: in a causal scan that means
the fused token is scanned first in every path, the backward path included. Importance is
ToP's: the clipped SSM output summed over channels and both paths, in token order.

Written per image with Python lists from the official forward's pieces in
:mod:`tests.reference.official_vim` (which share no code with ``amvim_mm``).
"""
import torch
import torch.nn.functional as F
from einops import rearrange

from .official_vim import inner_fn, rms_norm


def _mixer(sd, p, h, orders):
    """Vim's bidirectional mixer over explicit path orders (lists of token indices):
    (mixer output (1, L, D), importance (L,))."""
    L = h.shape[1]
    xz = rearrange(sd[p + 'in_proj.weight'] @ rearrange(h, 'b l d -> d (b l)'),
                   'd (b l) -> b d l', l=L)
    suffixes = ('', '_b')
    total = torch.zeros_like(xz[:, :xz.shape[1] // 2])
    imp = torch.zeros(L)
    for order, s in zip(orders, suffixes, strict=True):
        idx = torch.tensor(order)
        y = inner_fn(xz[..., idx], sd[p + f'conv1d{s}.weight'], sd[p + f'conv1d{s}.bias'],
                     sd[p + f'x_proj{s}.weight'], sd[p + f'dt_proj{s}.weight'],
                     -torch.exp(sd[p + f'A{s}_log'].float()), sd[p + f'D{s}'].float(),
                     sd[p + f'dt_proj{s}.bias'])
        back = torch.empty_like(y)
        back[..., idx] = y
        total = total + back
        imp += back[0].clamp_min(0).sum(0)
    out = F.linear(rearrange(total, 'b d l -> b l d') / 2, sd[p + 'out_proj.weight'])
    return out, imp


def evit_vim_forward(sd, x, keep_rate, locations, stride=16):
    """The class token after ``norm_f`` (B, D) of a Vim (middle class token) with EViT."""
    depth = 1 + max(int(k.split('.')[1]) for k in sd if k.startswith('layers.'))
    outs = []
    for img in x:
        t = F.conv2d(img[None], sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'],
                     stride=stride).flatten(2).transpose(1, 2)[0]
        M = t.shape[0]
        t = torch.cat([t[:M // 2], sd['cls_token'][0], t[M // 2:]]) + sd['pos_embed'][0]
        # the sequence: patches in raster order with the class token ('cls') at the middle
        toks = list(t)
        kinds = ['p'] * (M // 2) + ['cls'] + ['p'] * (M - M // 2)
        fused = None                  # (value, weight) of the fused token's stream
        residual, hidden, imp = None, torch.stack(toks), None
        for i in range(depth):
            stream = hidden if residual is None else residual + hidden
            if i - 1 in locations:
                patches = [j for j, k in enumerate(kinds) if k == 'p']
                n_keep = int(len(patches) * keep_rate)
                score = imp[patches]
                keep = sorted(patches[j] for j in score.argsort(descending=True)[:n_keep])
                gone = [j for j in patches if j not in keep]
                parts = [(stream[j], imp[j].clamp_min(0)) for j in gone]
                if fused is not None:
                    parts.append((fused, imp[-1].clamp_min(0)))
                w = sum(wt for _, wt in parts)
                val = sum(v * wt for v, wt in parts) / w if w > 0 else \
                    (fused if fused is not None else torch.zeros_like(stream[0]))
                kept = keep[:len(keep) // 2] + [kinds.index('cls')] + keep[len(keep) // 2:]
                fused = val
                stream = torch.cat([stream[kept], fused[None]])
                kinds = ['p'] * (len(keep) // 2) + ['cls'] + ['p'] * (len(keep) - len(keep) // 2) \
                    + ['fused']
                residual, hidden = stream, torch.zeros_like(stream)
            residual = hidden if residual is None else residual + hidden
            normed = rms_norm(residual, sd[f'layers.{i}.norm.weight'])
            L = normed.shape[0]
            if fused is None:
                orders = [list(range(L)), list(range(L))[::-1]]
            else:                     # the fused token (last in storage) opens both paths
                orders = [[L - 1] + list(range(L - 1)), [L - 1] + list(range(L - 1))[::-1]]
            hidden, imp = _mixer(sd, f'layers.{i}.mixer.', normed[None], orders)
            hidden, residual = hidden[0], residual.float()
            if fused is not None:
                fused = (residual + hidden)[-1]
        out = rms_norm(residual + hidden, sd['norm_f.weight'])
        outs.append(out[kinds.index('cls')])
    return torch.stack(outs)
