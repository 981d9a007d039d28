"""The job API's build-time pass: typed options, and a check of the ``TrainSpec`` a job returns.

Options reach a job as the strings of the config (``training.options``, ``--job-opt``); the
``option`` helper types them by their default. ``prepare`` refuses, in one sentence, a spec the
runtime would train wrongly: a loss whose reduction is not what the spec declares (a torch
loss's default ``reduction='mean'`` is the usual slip), a run shape that contradicts the
config's ``training`` keys, an optimizer that does not hold the model's parameters. A loss
declared ``mean`` is multiplied by its micro-batch's size, so the runtime's division by the
global batch gives the same gradients as the sum.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

import torch

if TYPE_CHECKING:
    from dpeer.trainer.job_api import JobContext, TrainSpec

T = TypeVar("T", bool, int, float, str)
RUN_KEYS = ("steps", "global_batch", "micro_batch", "seed")  # the config's training keys a spec carries
RUN_DEFAULTS: dict[str, Any] = {"steps": 20000, "global_batch": 64, "micro_batch": 16, "seed": 1234, "lr": 0.05}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class JobSpecError(ValueError):
    """A job option or ``TrainSpec`` the runtime cannot train correctly; the message says what to change."""


class LossReduction(str, enum.Enum):
    """How ``loss_fn`` reduces over its batch: ``reduction='sum'`` or torch's default ``'mean'``."""

    SUM = "sum"
    MEAN = "mean"


def option(options: Mapping[str, Any], key: str, default: T) -> T:
    """``options[key]`` converted to the type of ``default`` (bool, int, float or str), or
    ``default`` when absent; a value that does not convert is refused naming the key."""
    value = options.get(key, default)
    kind = type(default)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    text = str(value).strip()
    try:
        if kind is bool:
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError(text)
            return text.lower() in _TRUE  # type: ignore[return-value]
        return kind(text)  # type: ignore[return-value]
    except ValueError:
        raise JobSpecError(f"job option {key}={value!r} is not {'an' if kind is int else 'a'} {kind.__name__} "
                           f"(set it in training.options or with --job-opt {key}=...)") from None


def _probe(spec: TrainSpec, device: torch.device, collate: Callable[..., Any]) -> LossReduction | None:
    """The loss's reduction, measured on two samples and on the same two twice (a sum doubles, a
    mean stays), in eval mode without gradients so no state changes; None when it cannot tell."""
    if len(spec.dataset) < 2:
        return None
    model = spec.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            x, y = collate([spec.dataset[0], spec.dataset[1]])
            out, y = model(x.to(device)), y.to(device)
            if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor):
                return None
            pair = spec.loss_fn(out, y)
            if not isinstance(pair, torch.Tensor) or pair.dim() != 0:
                shape = tuple(pair.shape) if isinstance(pair, torch.Tensor) else type(pair).__name__
                raise JobSpecError(f"loss_fn must return one number (a 0-dim tensor), got {shape}: reduce it "
                                   "with reduction='sum' (or 'mean' and loss_reduction='mean')")
            twice = spec.loss_fn(torch.cat([out, out]), torch.cat([y, y]))
    finally:
        model.train(was_training)
    a, b = float(pair), float(twice)
    if a == 0.0 or not (abs(a) < float("inf")):
        return None
    ratio = b / a
    if abs(ratio - 2.0) < 1e-3:
        return LossReduction.SUM
    if abs(ratio - 1.0) < 1e-3:
        return LossReduction.MEAN
    return None  # a loss with a batch-independent term, say: trust what the spec declares


def _scaled_mean(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def summed(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) * len(target)

    summed.__doc__ = "the job's mean-reduced loss times its micro-batch's size: a sum over the batch"
    return summed


def _check_shape(spec: TrainSpec, ctx: JobContext) -> None:
    for key in ("steps", "global_batch", "micro_batch"):
        value = getattr(spec, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise JobSpecError(f"TrainSpec.{key} must be a positive int, got {value!r}")
    if spec.micro_batch > spec.global_batch:
        raise JobSpecError(f"TrainSpec.micro_batch ({spec.micro_batch}) is larger than global_batch "
                           f"({spec.global_batch})")
    for key in RUN_KEYS:
        if key in ctx.options and option(ctx.options, key, 0) != getattr(spec, key):
            raise JobSpecError(f"TrainSpec.{key} is {getattr(spec, key)} but the config's training.{key} is "
                               f"{ctx.options[key]}: pass ctx.{key} (the config's) or change training.{key}")


def prepare(spec: TrainSpec, ctx: JobContext, collate: Callable[..., Any]) -> TrainSpec:
    """Check the spec a job returned and make its loss a sum; raise JobSpecError on the first problem."""
    if not isinstance(spec.model, torch.nn.Module):
        raise JobSpecError(f"TrainSpec.model must be a torch.nn.Module, got {type(spec.model).__name__}")
    if not isinstance(spec.optimizer, torch.optim.Optimizer):
        raise JobSpecError(f"TrainSpec.optimizer must be a torch.optim.Optimizer, got {type(spec.optimizer).__name__}")
    if not callable(spec.loss_fn):
        raise JobSpecError("TrainSpec.loss_fn must be callable as loss_fn(output, target)")
    _check_shape(spec, ctx)
    if len(spec.dataset) < 1:
        raise JobSpecError("TrainSpec.dataset is empty")
    trainable = {id(p) for p in spec.model.parameters() if p.requires_grad}
    if not trainable:
        raise JobSpecError("the model has no trainable parameters")
    held = {id(p) for g in spec.optimizer.param_groups for p in g["params"]}
    if not held <= {id(p) for p in spec.model.parameters()}:
        raise JobSpecError("the optimizer holds tensors that are not the model's parameters: build it from "
                           "model.parameters() after moving the model to ctx.device")
    try:
        declared = LossReduction(spec.loss_reduction)
    except ValueError:
        raise JobSpecError(f"TrainSpec.loss_reduction must be 'sum' or 'mean', got {spec.loss_reduction!r}") from None
    measured = _probe(spec, ctx.device, collate)
    if measured is not None and measured is not declared:
        hint = ("pass reduction='sum' to the loss (torch losses default to 'mean') or set "
                "TrainSpec(loss_reduction='mean')" if measured is LossReduction.MEAN else
                "set TrainSpec(loss_reduction='sum'), the default")
        raise JobSpecError(f"loss_fn returns the {measured.value} over the batch but the TrainSpec declares "
                           f"loss_reduction={declared.value!r}: {hint}")
    spec.loss_reduction = declared
    if declared is LossReduction.MEAN:
        spec.loss_fn = _scaled_mean(spec.loss_fn)
    return spec
