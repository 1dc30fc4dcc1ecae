"""A test loop that runs the model's ``test_step`` under a chosen autocast dtype.

mmengine's ``TestLoop`` wraps every ``test_step`` in ``autocast(enabled=fp16)``: with
``fp16=False`` that *switches autocast off* inside the step, so wrapping ``runner.test()`` in
``torch.autocast`` changes nothing, and ``fp16=True`` always means float16 on CUDA. This loop
takes the dtype explicitly (``fp32``: autocast off, ``bf16``/``fp16``: autocast to that dtype on
the model's device), which is how ``tools/prune_eval.py --precision`` evaluates in mixed
precision.
"""
import torch
from mmengine.registry import LOOPS
from mmengine.runner.loops import TestLoop

from amvim_mm.errors import ConfigError

PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def precision_autocast(model, precision: str):
    """The autocast context of ``precision`` on the model's device (``fp32``: autocast off)."""
    dtype = PRECISIONS[precision]
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@LOOPS.register_module()
class AmpTestLoop(TestLoop):
    """``TestLoop`` with ``precision`` in ``fp32`` / ``bf16`` / ``fp16`` (see the module doc).

    Test losses (models whose ``test_step`` also returns losses) are not collected.
    """

    def __init__(self, runner, dataloader, evaluator, precision: str = 'fp32') -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f'AmpTestLoop: precision must be one of {", ".join(PRECISIONS)}, '
                              f'got {precision!r}')
        super().__init__(runner, dataloader, evaluator, fp16=False)
        self.precision = precision

    @torch.no_grad()
    def run_iter(self, idx, data_batch) -> None:
        self.runner.call_hook('before_test_iter', batch_idx=idx, data_batch=data_batch)
        with precision_autocast(self.runner.model, self.precision):
            outputs = self.runner.model.test_step(data_batch)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook('after_test_iter', batch_idx=idx, data_batch=data_batch,
                              outputs=outputs)
