"""The tools' distributed start (``--launcher``), as mmseg's / mmdet's ``tools/test.py`` take it.

``--launcher pytorch`` (``torchrun``: one process per GPU, any number of nodes), ``slurm``
(``srun``) or ``mpi``: the process group is started here, before any runner is built, with
NCCL on CUDA machines and gloo on a CPU (mmengine's ``init_dist`` would pin a CUDA device,
which a CPU machine has not; the test suite runs the distributed path with 2 CPU processes).
The runners themselves are then built with ``launcher='none'``: evaluation needs no
``DistributedDataParallel`` wrapper, while mmengine's samplers and ``collect_results`` read the
started process group (``get_dist_info``), so every test loop is sharded across the ranks and its
results gathered on rank 0, keyed by the data set's order.
"""
from __future__ import annotations

from typing import Any, List

from amvim_mm import runtime
from amvim_mm.errors import ConfigError

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def init_launcher(launcher: str, timeout_s: int = 1800) -> bool:
    """Start the process group for ``launcher`` (no-op for ``'none'`` or when one is running);
    returns whether the run is distributed."""
    import datetime

    import torch
    import torch.distributed as dist
    if launcher not in LAUNCHERS:
        raise ConfigError(f'unknown launcher {launcher!r}; choose from {", ".join(LAUNCHERS)}')
    if launcher == 'none':
        return False
    if dist.is_available() and dist.is_initialized():
        return True
    if launcher == 'pytorch' and 'RANK' not in runtime.launcher_environment():
        raise ConfigError('--launcher pytorch needs the environment torchrun sets (RANK, '
                          'WORLD_SIZE, MASTER_ADDR...): start the tool with torchrun '
                          '--nproc_per_node=N tools/... --launcher pytorch')
    if torch.cuda.is_available():
        from mmengine.dist import init_dist
        init_dist(launcher, backend='nccl', timeout=int(timeout_s))    # seconds: mmengine's unit
        return True
    if launcher != 'pytorch':
        raise ConfigError(f'--launcher {launcher} on a machine without CUDA: use torchrun '
                          '(--launcher pytorch), which starts gloo processes on the CPU')
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=timeout_s))
    return True


def rank() -> int:
    from mmengine.dist import get_rank
    return get_rank()


def world_size() -> int:
    from mmengine.dist import get_world_size
    return get_world_size()


def is_main() -> bool:
    """Rank 0 (or no process group): the process that writes files and prints."""
    return rank() == 0


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable object; unchanged without a group)."""
    if world_size() == 1:
        return obj
    from mmengine.dist import broadcast_object_list
    box: List[Any] = [obj]
    broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        from mmengine.dist import barrier as _barrier
        _barrier()


def local_world_size() -> int:
    """Processes on this node (the launcher's ``LOCAL_WORLD_SIZE``; 1 without one)."""
    return int(runtime.launcher_environment().get('LOCAL_WORLD_SIZE', '1'))


def shutdown() -> None:
    """End the process group a tool started (after its last collective)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
