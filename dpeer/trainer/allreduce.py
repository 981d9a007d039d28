"""Gradient allreduce in the current group.

``allreduce_step`` sends every gradient in one contiguous float32 buffer, with a few control slots
piggybacked at the end (the summed loss and, per rank, the newest generation that rank has seen),
so one collective per step both commits the step and lets the group agree on a generation switch.
Each rank backpropagates the *sum* of its per-sample losses; the reduced sum is divided by the
step's global sample count, so the gradient is the mean over exactly the step's samples whatever
the world size.

``current_group_hook`` is a DDP comm hook with the same semantics. Stock DDP keeps the process
group it was built with and silently goes on using it after a re-form; the hook looks up the
current default group on every call, so a DDP-wrapped model survives re-formation.
"""


from dataclasses import dataclass

import torch
import torch.distributed as dist

_CONTROL_SLOTS = 1


@dataclass(frozen=True)
class StepReduction:
    """What the group agreed on in a step's allreduce."""

    loss_mean: float
    newest_seen_by_rank: list[int]


def flatten_grads(params: list[torch.Tensor], extra: int, device: torch.device) -> torch.Tensor:
    """One buffer holding every gradient (zeros where a grad is missing) and ``extra`` slots, in
    float64 when any parameter is float64 (else float32), so no gradient is rounded on the way."""
    total = sum(p.numel() for p in params)
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
    flat = torch.zeros(total + extra, dtype=dtype, device=device)
    off = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            flat[off : off + n].copy_(p.grad.reshape(-1))
        off += n
    return flat


def unflatten_into_grads(flat: torch.Tensor, params: list[torch.Tensor], scale: float) -> None:
    """Write ``flat * scale`` back into each parameter's ``.grad``."""
    off = 0
    for p in params:
        n = p.numel()
        g = flat[off : off + n].reshape(p.shape).to(dtype=p.dtype, device=p.device) * scale
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)
        off += n


def allreduce_step(
    params: list[torch.Tensor],
    local_loss_sum: float,
    newest_seen: int,
    rank: int,
    world: int,
    global_samples: int,
    device: torch.device,
) -> StepReduction:
    """Sum-allreduce grads and control slots, then set grads to the mean over ``global_samples``.

    Raises RuntimeError (from torch.distributed) when a peer died or the collective timed out.
    Generations travel as float32, exact below 2**24.
    """
    extra = _CONTROL_SLOTS + world
    flat = flatten_grads(params, extra, device)
    n = flat.numel() - extra
    flat[n] = local_loss_sum
    flat[n + _CONTROL_SLOTS + rank] = float(newest_seen)
    dist.all_reduce(flat)
    control = flat[n:].to("cpu")
    unflatten_into_grads(flat[:n], params, 1.0 / global_samples)
    seen = [int(v) for v in control[_CONTROL_SLOTS:].tolist()]
    return StepReduction(float(control[0]) / global_samples, seen)


class HookState:
    """State of ``current_group_hook``: the step's global sample count, set before each backward."""

    def __init__(self, global_samples: int) -> None:
        self.global_samples = global_samples


def current_group_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: sum the bucket in the *current* default group, divide by global samples."""
    group = dist.distributed_c10d._get_default_group()
    buf = bucket.buffer()
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

    def _scale(f: torch.futures.Future) -> torch.Tensor:
        return f.value()[0].div_(state.global_samples)

    return fut.then(_scale)
