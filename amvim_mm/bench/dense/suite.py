"""The dense suite's runner: builds, runs and records the planned rows."""
from __future__ import annotations

import collections
import copy
import dataclasses
import gc
import json
import os
import os.path as osp
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.analysis.flops import backbone_flops
from amvim_mm.bench.measure import _timer
from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction.reducers import build_reducer

from .config import GRAPH_IMPLS, IMPLS, IN1K_HEAD, PEER_NOTE, TRAINING, WORKLOADS, DenseSizes
from .models import build_ade, build_coco, build_in1k
from .plan import Case, model_name
from .probe import set_fused_mixer
from .report import add_ratios, markdown, stack_versions
from .timing import autocast_for, prepare_step, summarize, tensor_bytes


def group_key(case: Case, index: int) -> tuple:
    """Rows timed together in interleaved rounds (:meth:`DenseSuite.run_group`): the inference
    rows of one model, implementation, size and mode, whatever their reduction; a training or
    peer row is a group of its own (``index``: its place in the plan)."""
    if case.workload in TRAINING or case.model == 'peer':
        return ('row', index)
    return (case.workload, case.model, case.impl, case.res, case.batch, case.mode)


def _counted(stats: Optional[collections.Counter], fn: Callable[[], object]):
    """(``fn()``, the CUDA-graph captures and replays it made by the counters ``stats``)."""
    before = collections.Counter(stats) if stats is not None else None
    out = fn()
    return out, (collections.Counter(stats) - before) if before is not None \
        else collections.Counter()


def _flops_ratio(backbone: nn.Module, res: int, red) -> Optional[float]:
    """The backbone's GFLOPs with ``red`` over those without (our convention), for the
    ceiling of the whole model's speed-up (:func:`~.report.add_ratios`)."""
    try:
        reduced = backbone_flops(backbone, res, 'model')['gflops']
        dense = backbone_flops(backbone, res, None)['gflops']
    except (ConfigError, NotImplementedError, AttributeError):   # a backbone without flops
        return None
    return round(reduced / dense, 4) if dense else None


def _kind(workload: str) -> str:
    """The model kind a workload runs on: the ADE20K workloads share one UperNet."""
    return 'ade' if workload.startswith('ade') else workload


def _label(case: Case) -> str:
    return (f'{case.workload} {case.res}px b{case.batch} {case.model} {case.impl} '
            f'{case.reduction_name}' + (' graph' if case.mode == 'graph' else ''))


class DenseSuite:
    """Run the planned rows; keep models and inputs while they are needed; write the results
    (JSON and markdown) after every row, so a run cut short keeps what it measured."""

    def __init__(self, *, sizes: DenseSizes, workloads: Sequence[str], device: str,
                 out_dir: str, root: str, command: str, budget_s: Optional[float] = None,
                 smoke: bool = False, infer_modes: Sequence[str] = ('eager', ),
                 log: Callable[[str], None] = print, dtype: str = 'bf16') -> None:
        self.sizes, self.workloads, self.device = sizes, list(workloads), device
        self.infer_modes = tuple(infer_modes)
        self.out_dir, self.root, self.log, self.smoke = out_dir, root, log, smoke
        self.dtype = dtype          # 'bf16': autocast; 'fp32': none
        self.t0 = time.perf_counter()
        self.deadline = None if budget_s is None else self.t0 + budget_s
        self.models: Dict[Tuple[str, str], object] = {}
        self.inputs: Dict[tuple, object] = {}
        self.rows: List[dict] = []
        self.skipped: List[dict] = []
        #: the seconds each row of a workload took (model builds excluded)
        self.row_cost: Dict[str, List[float]] = {}
        self.build_s = 0.0
        self.result = dict(command=command, suite='dense', smoke=smoke, device=device,
                           dtype=self.dtype, budget_s=budget_s,
                           infer_modes=list(self.infer_modes),
                           sizes=dataclasses.asdict(sizes), workloads={
                               w: WORKLOADS[w] for w in self.workloads},
                           notes=self._notes())

    # -------------------------------------------------------------------- setup
    def _notes(self) -> List[str]:
        s = self.sizes
        return [
            'impl auto: fused_mixer=None (automatic choice); unfused: fused_mixer=False; '
            'forced: fused_mixer=True (inference only); auto-graphs / unfused-graphs (eager '
            'inference rows): the same with the backbone\'s cuda_graph=True (its forward '
            'replayed from a CUDA graph in the eager pipeline; fused_over_unfused: one over '
            'the other, over_unfused_no_graphs: auto-graphs over the plain unfused row); '
            'peer: ' + PEER_NOTE,
            'path_ran / fused_calls: what the mixers decided in a probed warm-up call '
            '(mixed: some calls fused, e.g. the blocks ToP scores or aligns on the unfused path)',
            'training rows eager: forward, loss, backward and (ade, in1k) the optimizer step, '
            'gradients set to None after every step; inference rows in the modes '
            + ', '.join(self.infer_modes) + ' (graph: the call captured in one CUDA graph '
            'after an eager warm-up, its replays timed; ratios within one mode only)',
            'ade-slide in graph mode: the windows\' forward (encode_decode of the batch of '
            'windows); the host-side window bookkeeping of mmseg\'s slide inference (its '
            'count check syncs) is not capturable',
            'ade-backbone: the UperNet\'s backbone alone (four feature maps); backbone_share '
            '(ade-whole rows): backbone ms / whole ms of the same model, path, size and mode; '
            'ratio_cap (ade-whole fused rows): the unfused whole ms over its ms outside the '
            'backbone, the fused / unfused ratio with a backbone that took no time',
            f'ade-slide: crop {s.ade_crop}, stride {s.ade_stride}: one window per '
            f'{s.ade_crop} x {s.ade_crop} image, so batch = windows per forward',
            'ade-whole sizes (res:batch): ' + ', '.join(f'{r}:{b}' for r, b in s.whole),
            'ours_over_peer: img/s over the peer at the same workload, resolution and batch '
            '(the peer is never reduced); fused_over_unfused: over the unfused row of the same '
            'model and reduction; speedup_vs_unreduced: over the same model and impl without '
            'reduction',
            'the peer\'s AdamW is one parameter group (the layer-decay constructor needs '
            'get_layer_depth); the same lr, weight decay and betas',
            'weights are restored to the same starting values before every row (group)',
            'inference rows of one model, impl, size and mode (their reductions: none, ToMe '
            '...) are timed in interleaved rounds: each row warmed up on its own, then a round '
            'times every row\'s iters calls once; medians over the rounds, so a drift of the '
            'host hits every row of the group alike',
        ]

    def _model(self, workload: str, model: str):
        """The model (and optimizer config) of ``workload`` and ``model``, built once; a build
        error is kept and re-raised for every row of that model."""
        kind = _kind(workload)
        key = (kind, model)
        if key not in self.models:
            torch.manual_seed(0)
            t0 = time.perf_counter()
            try:
                if kind == 'ade':
                    built = build_ade(model, self.sizes, self.root, self.device)
                elif kind == 'coco':
                    built = (build_coco(model, self.sizes, self.device), None)
                else:
                    built = build_in1k(model, self.sizes, self.device)
                net = built[0]
                # the starting weights (on the CPU: not counted in any row's memory)
                snapshot = [t.detach().to('cpu', copy=True) for t in net.state_dict().values()]
                self.models[key] = (net, built[1], snapshot)
                n = sum(p.numel() for p in net.parameters())
                self.log(f'  built {kind} {model}: {n / 1e6:.2f} M parameters')
            except Exception as e:   # noqa: BLE001  (recorded in every row of this model)
                self.models[key] = e.with_traceback(None)
            self.build_s += time.perf_counter() - t0
        got = self.models[key]
        if isinstance(got, Exception):
            raise got
        return got

    def _release(self, keep_kinds: Sequence[str]) -> None:
        """Drop the models and inputs of workloads that no remaining row needs."""
        drop = [k for k in self.models if k[0] not in keep_kinds]
        drop_inputs = [k for k in self.inputs if k[0] not in keep_kinds]
        for key in drop:
            del self.models[key]
        for key in drop_inputs:
            del self.inputs[key]
        if drop or drop_inputs:
            gc.collect()
            if self.device == 'cuda':
                torch.cuda.empty_cache()

    def _images(self, kind: str, res: int, batch: int) -> torch.Tensor:
        key = (kind, 'images', res, batch)
        if key not in self.inputs:
            g = torch.Generator(device='cpu').manual_seed(res * 1000 + batch)
            self.inputs[key] = torch.randn(batch, 3, res, res, generator=g).to(self.device)
        return self.inputs[key]

    def _labels(self, kind: str, res: int, batch: int, classes: int, dense: bool):
        key = (kind, 'labels', res, batch)
        if key not in self.inputs:
            g = torch.Generator(device='cpu').manual_seed(res * 1000 + batch + 1)
            shape = (batch, 1, res, res) if dense else (batch, )
            self.inputs[key] = torch.randint(0, classes, shape, generator=g).to(self.device)
        return self.inputs[key]

    # -------------------------------------------------------------------- steps
    def _step(self, case: Case, net: nn.Module, optim_cfg
              ) -> Tuple[Callable, dict, List[torch.Tensor]]:
        """The timed call of ``case`` on ``net``, the row's descriptive fields and the input
        tensors the call reads."""
        dev, dtype, w = self.device, self.dtype, case.workload
        kind = _kind(w)
        x = self._images(kind, case.res, case.batch)
        inputs = [x]
        info: Dict[str, object] = {}
        if w in TRAINING:
            net.train()
            optimizer = None
            if optim_cfg is not None:
                from mmengine.optim import build_optim_wrapper
                wrapper = build_optim_wrapper(net, copy.deepcopy(optim_cfg))
                optimizer = wrapper.optimizer
                info['optimizer'] = (f'{type(optimizer).__name__}, '
                                     f'{len(optimizer.param_groups)} parameter groups')
            if w == 'ade-train':
                samples = self._seg_samples(case, train=True)
                inputs.append(self._labels('ade', case.res, case.batch, 150, True))

                def forward():
                    losses = net(x, samples, mode='loss')
                    return net.parse_losses(losses)[0]
                info['step'] = 'loss (mmseg EncoderDecoder), backward, optimizer step'
            elif w == 'in1k':
                y = self._labels(kind, case.res, case.batch, IN1K_HEAD['num_classes'], False)
                inputs.append(y)

                def forward():
                    return F.cross_entropy(net(x).float(), y,
                                           label_smoothing=IN1K_HEAD['label_smooth_val'])
                info['step'] = 'cross-entropy (label smoothing 0.1), backward, optimizer step'
            else:
                def forward():
                    return sum(o.float().mean() for o in net(x))
                info['step'] = 'forward, sum of the 5 levels\' means, backward (no optimizer)'

            def step():
                with autocast_for(dev, dtype):
                    loss = forward()
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
                net.zero_grad(set_to_none=True)
            info['mode'] = 'train-eager'
            return step, info, inputs
        net.eval()
        info['mode'] = f'infer-{case.mode}'
        if w == 'ade-backbone':
            def step():
                with torch.no_grad(), autocast_for(dev, dtype):
                    return net.backbone(x)
            info['step'] = 'backbone forward (the UperNet\'s backbone), four feature maps'
            return step, info, inputs
        mode = 'slide' if w == 'ade-slide' else 'whole'
        net.test_cfg['mode'] = mode
        metas = self._seg_samples(case, train=False)
        if mode == 'slide':
            h_crop, _ = net.test_cfg['crop_size']
            h_stride, _ = net.test_cfg['stride']
            grids = (max(case.res - h_crop + h_stride - 1, 0) // h_stride + 1) ** 2
            info['windows_per_forward'] = grids * case.batch
        if mode == 'slide' and case.mode == 'graph':
            if case.res != h_crop:
                raise ConfigError('graph-mode slide rows need the image size to equal the '
                                  f'crop ({h_crop}): one window per image')

            def step():
                with torch.no_grad(), autocast_for(dev, dtype):
                    return net.encode_decode(x, metas).argmax(1)
            info['step'] = 'the windows\' forward (encode_decode), logits + argmax'
            return step, info, inputs

        def step():
            with torch.no_grad(), autocast_for(dev, dtype):
                return net.inference(x, metas).argmax(1)
        info['step'] = f'{mode} inference (mmseg), logits + argmax'
        return step, info, inputs

    def _seg_samples(self, case: Case, train: bool):
        """Training: SegDataSamples with random ground truth; inference: image metas."""
        res = case.res
        meta = dict(img_shape=(res, res), ori_shape=(res, res), pad_shape=(res, res))
        if not train:
            return [dict(meta) for _ in range(case.batch)]
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        labels = self._labels('ade', res, case.batch, 150, True)
        return [SegDataSample(gt_sem_seg=PixelData(data=labels[i]), metainfo=dict(meta))
                for i in range(case.batch)]

    # -------------------------------------------------------------------- rows
    def _row_head(self, case: Case) -> Dict[str, object]:
        return dict(
            workload=case.workload, model=model_name(case.model, self.sizes), impl=case.impl,
            reduction=case.reduction_name, res=case.res, batch=case.batch, dtype=self.dtype,
            mode=f'{"train" if case.workload in TRAINING else "infer"}-{case.mode}',
            fused_mixer=str(IMPLS[case.impl]) if case.impl in IMPLS else None,
            backbone_cuda_graph=case.impl in GRAPH_IMPLS)

    @staticmethod
    def _error(e: Exception) -> str:
        msg = str(e).strip().splitlines()
        return f'{type(e).__name__}: {msg[0][:300]}' if msg else type(e).__name__

    def _prepare_row(self, case: Case, row: dict, net: nn.Module, optim_cfg, stats) -> tuple:
        """Set ``case``'s reducer, build its step and warm it up (:func:`prepare_step`); the
        row gets the step's fields. Returns (case, row, call, reducer, graph counters, times)."""
        red = None
        if case.model != 'peer':
            red = build_reducer(case.reduction)
            net.backbone.set_token_reduction(red)
        step, info, inputs = self._step(case, net, optim_cfg)
        row.update(info)
        own = tensor_bytes(list(net.parameters()) + list(net.buffers()) + inputs)
        (call, fields), graphs = _counted(stats, lambda: prepare_step(
            step, net, device=self.device, warmup=self.sizes.warmup, own_bytes=own,
            graph=case.mode == 'graph'))
        row.update(fields)
        if red is not None:
            row['token_counts'] = list(getattr(net.backbone, 'token_counts', []))
            row['flops_ratio'] = _flops_ratio(net.backbone, case.res, red)
        return case, row, call, red, graphs, []

    def run_group(self, cases: Sequence[Case]) -> List[dict]:
        """Measure rows of one model that differ only in their reduction (:func:`group_key`;
        one row for training and peer rows): each row is set up, warmed up and probed on its
        own, then all are timed in interleaved rounds - a round times every row's ``iters``
        calls once, the row's reducer set before them - so a drift of the host (the rows at
        batch 1 are bound by it) hits every row of the group alike. Errors are recorded in
        the rows, not raised."""
        s, first = self.sizes, cases[0]
        rows = [self._row_head(c) for c in cases]
        iters = s.train_iters if first.workload in TRAINING else s.infer_iters
        net = None
        live: list = []       # (case, row, call, reducer, graph counters)
        try:
            net, optim_cfg, snapshot = self._model(first.workload, first.model)
            with torch.no_grad():
                for t, v in zip(net.state_dict().values(), snapshot):
                    t.copy_(v)
            ours = first.model != 'peer'
            if ours:
                set_fused_mixer(net, IMPLS[first.impl])
                net.backbone.cuda_graph = first.impl in GRAPH_IMPLS    # False: plain eager
            stats = net.backbone._graphs.stats if ours else None
            for case, row in zip(cases, rows):
                try:
                    live.append(self._prepare_row(case, row, net, optim_cfg, stats))
                except Exception as e:   # noqa: BLE001  (one failing row must not lose the run)
                    row['error'] = self._error(e)
                    gc.collect()     # the traceback's frames hold the row's tensors
            for _ in range(s.repeats):
                for item in list(live):
                    case, row, call, red, graphs, times = item
                    try:
                        if ours:
                            net.backbone.set_token_reduction(red)
                        t, got = _counted(stats, lambda: _timer(call, iters, self.device))
                        times.append(t)
                        graphs.update(got)
                    except Exception as e:   # noqa: BLE001
                        row['error'] = self._error(e)
                        live.remove(item)
                        gc.collect()
            for case, row, call, red, graphs, times in live:
                row.update(summarize(times, case.batch))
                row.update(warmup=s.warmup, iters=iters, repeats=s.repeats)
                if case.impl in GRAPH_IMPLS:
                    row['backbone_graphs'] = (f'{graphs["capture"]} captured, '
                                              f'{graphs["replay"]} replays')
        except Exception as e:   # noqa: BLE001  (the model's build; recorded in every row)
            for row in rows:
                row.setdefault('error', self._error(e))
            gc.collect()
        finally:
            live.clear()                         # the captured graphs and their memory
            if net is not None:
                net.zero_grad(set_to_none=True)
                if first.model != 'peer':
                    net.backbone.set_token_reduction(None)
                    set_fused_mixer(net, None)
                    net.backbone.cuda_graph = None
                    net.backbone.reset_cuda_graphs()
                    net.backbone._graphs.stats.clear()
            if self.device == 'cuda':
                torch.cuda.empty_cache()
        return rows

    def _skip_reason(self, case: Case, rows: int = 1) -> Optional[str]:
        if case.mode == 'graph' and self.device != 'cuda':
            return 'CUDA graphs need a CUDA device'
        if case.impl == 'forced':
            from amvim_mm.ops.fused_mixer import fused_mixer_available
            ok, why = fused_mixer_available(self.device)
            if not ok:
                return ('the fused path runs on the CPU in Triton\'s interpreter only '
                        '(TRITON_INTERPRET=1 before Python starts)' if self.device == 'cpu'
                        else f'the fused path is not usable: {why}')
        if self.deadline is not None:
            left = self.deadline - time.perf_counter()
            # the median, not the longest: a workload's first rows also compile kernels
            need = statistics.median(self.row_cost.get(case.workload, [0.0])) * rows
            if left <= need or left <= 0:
                return (f'time budget: {max(left, 0):.0f} s left, a {case.workload} row '
                        f'takes about {need / rows:.0f} s')
        return None

    def run(self, cases: Sequence[Case]) -> dict:
        """Run ``cases`` (in groups of :func:`group_key`, in the order of each group's first
        case); returns the result dict (also written to ``out_dir``)."""
        from amvim_mm.bench.measure import environment
        self.result['environment'] = dict(environment(), **stack_versions())
        self.log(f'environment: {self.result["environment"]}')
        self.log(f'dense suite: {len(cases)} rows on {self.device}'
                 + (f', budget {self.deadline - self.t0:.0f} s' if self.deadline else ''))
        groups: Dict[tuple, List[Case]] = {}
        for i, case in enumerate(cases):
            groups.setdefault(group_key(case, i), []).append(case)
        order = list(groups.values())
        done = 0
        for g, group in enumerate(order):
            self._release({_kind(c.workload) for later in order[g:] for c in later})
            first = group[0]
            why = self._skip_reason(first, len(group))
            if why is not None:
                for case in group:
                    done += 1
                    self.skipped.append(dict(
                        workload=case.workload, model=model_name(case.model, self.sizes),
                        impl=case.impl, reduction=case.reduction_name, res=case.res,
                        batch=case.batch, mode=case.mode, reason=why))
                    self.log(f'  [{done}/{len(cases)}] {_label(case)}: skipped ({why})')
                continue
            t, built = time.perf_counter(), self.build_s
            rows = self.run_group(group)
            cost = (time.perf_counter() - t - (self.build_s - built)) / len(group)
            for case, row in zip(group, rows):
                done += 1
                self.row_cost.setdefault(case.workload, []).append(cost)
                row['row_wall_s'] = round(cost, 2)
                self.rows.append(row)
                self.log(f'  [{done}/{len(cases)}] {_label(case)}: '
                         + (f'{row.get("img_per_s")} img/s, {row.get("ms_per_iter")} ms, '
                            f'{row.get("peak_mib")} MiB, path {row.get("path_ran")} '
                            f'({row.get("fused_calls", "-")})' if 'error' not in row
                            else f'ERROR {row["error"]}'))
            self.write()
        self._release(())
        self.write()
        return self.result

    # -------------------------------------------------------------------- output
    def write(self) -> None:
        add_ratios(self.rows)
        self.result.update(rows=self.rows, skipped=self.skipped,
                           wall_s=round(time.perf_counter() - self.t0, 1))
        os.makedirs(self.out_dir, exist_ok=True)
        path = osp.join(self.out_dir, 'benchmark_dense.json')
        tmp = path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(self.result, f, indent=1)
        os.replace(tmp, path)
        with open(osp.join(self.out_dir, 'benchmark_dense.md'), 'w') as f:
            f.write(markdown(self.result) + '\n')
