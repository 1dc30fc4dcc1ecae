"""Check an exported model: ONNX Runtime (CPU) against PyTorch on random and real images.

    python tools/deploy/check_onnx.py CONFIG CHECKPOINT MODEL.onnx [--random N] [--real N|all]
        [--batch B] [--threads T] [--tol 1e-4] [--reduce ... as tools/test.py]
        [--cfg-options k=v ...]

The PyTorch model is built as ``tools/deploy/export_onnx.py`` built it (same config, checkpoint
and ``--reduce`` options). Per output it prints the maximum relative error
``max|onnx - torch| / max|torch|`` over N random images (standard normal, seed 0) and over the
first N images of the config's test set (through the model's data preprocessor), the argmax
agreement of the first output (per pixel for segmentation, per image for classification), and
the test metric of those real images computed from each side's outputs by the libraries' own
post-processing and metric (mIoU for segmentation, top-1 for classification, box AP for a
single-stage detector). Exit code 1 when an error exceeds ``--tol``.
"""
import argparse
import copy
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7

import numpy as np

from amvim_mm.apis.cli import positive_int, run_cli
from amvim_mm.deploy.ort import (flatten_outputs, max_relative_error, near_ties, ort_session,
                                  run_onnx)
from amvim_mm.deploy.tasks import TaskForward, add_model_args, load_task_model
from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction.margins import NEAR_TIE


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument('onnx', help='the exported model (tools/deploy/export_onnx.py)')
    p.add_argument('--random', type=int, default=8, metavar='N', help='random images')
    p.add_argument('--real', default='8', metavar='N',
                   help="images of the config's test set ('all': every one)")
    p.add_argument('--batch', type=int, default=None,
                   help='batch size (default: 4, or the ONNX model\'s fixed batch)')
    p.add_argument('--threads', type=positive_int, default=None,
                   help='CPU threads of both runtimes')
    p.add_argument('--tol', type=float, default=1e-4, help='largest accepted relative error')
    args = p.parse_args(argv)
    if args.real != 'all' and (not args.real.isdigit()):
        p.error(f"--real takes a count or 'all', got {args.real!r}")
    if args.random < 0:
        p.error(f'--random takes a count >= 0, got {args.random}')
    if args.random == 0 and args.real == '0':
        p.error('--random 0 and --real 0 compare nothing; give images to compare')
    if not 0 <= args.tol < float('inf'):
        p.error(f'--tol takes a finite number >= 0, got {args.tol}')
    return args


def input_spec(session, batch):
    """(batch, (H, W)) of the session's image input; one-line error for a batch it cannot run."""
    shape = session.get_inputs()[0].shape
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        raise ConfigError(f'expected an image input (B, 3, H, W) with a fixed H, W; the ONNX '
                          f'model takes {shape}')
    fixed = shape[0] if isinstance(shape[0], int) else None
    if batch is not None and fixed is not None and batch != fixed:
        raise ConfigError(f'the ONNX model was exported with a fixed batch of {fixed}; '
                          f'export with a dynamic deploy config for --batch {batch}')
    return batch or fixed or 4, (shape[2], shape[3])


class Tally:
    """Running per-output maximum relative error and argmax agreement of the first output;
    the images at a near tie of the reducer's token choices are kept apart (``tie_err``)."""

    def __init__(self, names):
        self.names, self.err = names, {n: 0.0 for n in names}
        self.tie_err = {n: 0.0 for n in names}
        self.agree = self.total = self.ties = 0

    def add(self, ref, got, ties=None):
        ties = np.zeros(len(ref[0]), dtype=bool) if ties is None else np.asarray(ties)
        self.ties += int(ties.sum())
        for n, r, g in zip(self.names, ref, got, strict=True):
            if r.shape[:1] != ties.shape:     # an output without a batch axis
                self.err[n] = max(self.err[n], max_relative_error(r, g))
                continue
            for errs, sel in ((self.err, ~ties), (self.tie_err, ties)):
                if sel.any():
                    errs[n] = max(errs[n], max_relative_error(r[sel], g[sel]))
        if ref[0].ndim >= 2:
            same = ref[0].argmax(axis=1) == got[0].argmax(axis=1)
            self.agree += int(same.sum())
            self.total += same.size

    def line(self, what, count):
        errs = ', '.join(f'{n} {e:.2e}' for n, e in self.err.items())
        agree = f'; argmax agreement {self.agree / self.total:.6f}' if self.total else ''
        line = f'{what} ({count} images): max relative error {errs}{agree}'
        if self.ties:
            tie = ', '.join(f'{n} {e:.2e}' for n, e in self.tie_err.items())
            line += (f'\n  {self.ties} of them at a near tie of the token choices (margin < '
                     f'{NEAR_TIE:g}: the runtimes may choose differently there, '
                     f'docs/deploy.md): max relative error {tie}, not counted')
        return line


def both(forward, session, images):
    """(PyTorch's outputs, ONNX Runtime's, the images at a near tie of the reducer's token
    choices (None without a reducer that chooses by the features))."""
    import torch
    with torch.no_grad():
        ref = [t.float().numpy() for t in flatten_outputs(forward(images))]
    return ref, run_onnx(session, images), near_ties(forward, images)


def predict_from(model, scope, outs, samples):
    """The libraries' own post-processing of the raw outputs into data samples (or None)."""
    import torch
    outs = [torch.from_numpy(np.asarray(o)) for o in outs]
    samples = copy.deepcopy(samples)
    if scope == 'mmseg':
        return model.postprocess_result(outs[0], samples)
    if scope == 'mmpretrain' and hasattr(model.head, '_get_predictions'):
        return model.head._get_predictions(outs[0], samples)
    head = getattr(model, 'bbox_head', None)
    if scope == 'mmdet' and head is not None and hasattr(head, 'predict_by_feat'):
        n = len(outs) // 2
        results = head.predict_by_feat(outs[:n], outs[n:], batch_img_metas=[
            s.metainfo for s in samples], rescale=True)
        return model.add_pred_to_datasample(samples, results)
    return None


def real_batches(cfg, model, count, batch, size):
    """(preprocessed images, data samples) of the first ``count`` test images (None: all)."""
    from mmengine.runner import Runner
    loader_cfg = copy.deepcopy(cfg.test_dataloader)
    loader_cfg['batch_size'] = batch
    loader_cfg['num_workers'] = 0
    loader_cfg.pop('persistent_workers', None)
    seen = 0
    for data in Runner.build_dataloader(loader_cfg):
        if count is not None and seen >= count:
            return
        data = model.data_preprocessor(data, False)
        images, samples = data['inputs'], data['data_samples']
        if count is not None:
            images, samples = images[:count - seen], samples[:count - seen]
        if tuple(images.shape[2:]) != tuple(size):
            raise ConfigError(f'a test image is {tuple(images.shape[2:])} after the data '
                              f'preprocessor; the ONNX model was exported at {tuple(size)}')
        seen += len(samples)
        yield images, samples


def check_real(args, cfg, model, forward, session, tally, batch, size):
    """Compare on real images; returns (count, {side: metrics}) (metrics empty without one)."""
    from mmengine.evaluator import Evaluator
    count = None if args.real == 'all' else int(args.real)
    from mmengine.runner import Runner
    meta = Runner.build_dataloader(copy.deepcopy(cfg.test_dataloader)).dataset.metainfo
    evaluators = {side: Evaluator(copy.deepcopy(cfg.test_evaluator)) for side in
                  ('onnxruntime', 'pytorch')}
    for ev in evaluators.values():
        ev.dataset_meta = meta
    seen, scored, img_ids = 0, True, []
    for images, samples in real_batches(cfg, model, count, batch, size):
        ref, got, ties = both(forward, session, images)
        tally.add(ref, got, ties)
        seen += len(samples)
        img_ids += [s.metainfo.get('img_id') for s in samples]
        for side, outs in (('onnxruntime', got), ('pytorch', ref)):
            predicted = predict_from(model, cfg.default_scope, outs, samples)
            scored = scored and predicted is not None
            if predicted is not None:
                evaluators[side].process(data_samples=predicted, data_batch=None)
    if not seen or not scored:
        return seen, {}
    if None not in img_ids:   # COCO: score the images seen against their own annotations
        for ev in evaluators.values():
            for metric in ev.metrics:
                if hasattr(metric, 'img_ids'):
                    metric.img_ids = list(img_ids)
    return seen, {side: ev.evaluate(seen) for side, ev in evaluators.items()}


def main(argv=None) -> int:
    import torch
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    session = ort_session(args.onnx, args.threads)
    batch, size = input_spec(session, args.batch)
    cfg, model = load_task_model(args)
    forward = TaskForward(model, cfg.default_scope, size).eval()
    names = [o.name for o in session.get_outputs()]
    worst = 0.0
    gen = torch.Generator().manual_seed(0)
    tally = Tally(names)
    for start in range(0, args.random, batch):
        images = torch.randn(min(batch, args.random - start), 3, *size, generator=gen)
        tally.add(*both(forward, session, images))
    if args.random:
        print(tally.line('random', args.random))
        worst = max(tally.err.values())
    if args.real != '0':
        tally = Tally(names)
        seen, metrics = check_real(args, cfg, model, forward, session, tally, batch, size)
        print(tally.line('real', seen))
        worst = max([worst, *tally.err.values()])
        for side, m in metrics.items():
            print(f'{side:12s} metric on those images: '
                  + ', '.join(f'{k} {float(v):.4f}' for k, v in m.items()))
    ok = worst <= args.tol
    print(f"{'OK' if ok else 'FAILED'}: largest relative error {worst:.2e} "
          f"({'<=' if ok else '>'} --tol {args.tol:g})")
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(run_cli(main))
