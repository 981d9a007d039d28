"""A training script of the user's own as the box's job (``dpeer start --job train.py``).

The worker prepares a ``Launch`` (this box's name, device, run shape, channel to the daemon), then
runs the script as ``__main__``; the script takes it with ``dpeer.job.connect()``, registers what
must be healed and checkpointed, and loops over ``run.steps(loader)`` (step.py says what a step
guarantees). The runtime's loop is the same one a TrainSpec job runs (loop.Trainer).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader

from dpeer.trainer.feed import LoaderFeed
from dpeer.trainer.job_api import JobContext, TrainSpec
from dpeer.trainer.loop import LoopConfig, Trainer
from dpeer.trainer.portable import load_initial
from dpeer.trainer.step import Step
from dpeer.trainer.viewsource import ViewSource


class JobUsageError(RuntimeError):
    """The script used dpeer's API wrongly; the text says what to change."""


@dataclass
class Launch:
    """What the worker hands the script: its context, the loop's config, the daemon's channel, the
    bound rendezvous socket, and what to run once the job is built (the worker's report)."""

    ctx: JobContext
    config: LoopConfig
    source: ViewSource
    store: socket.socket | None
    on_built: Callable[[float], None]
    init_from: str | None = None
    run: Run | None = field(default=None, repr=False)


_offered: list[Launch] = []


def offer(launch: Launch) -> None:
    """The worker: make ``launch`` the one ``connect()`` takes."""
    _offered[:] = [launch]


def taken() -> Launch | None:
    """The worker: the launch offered, with the Run the script made of it (None: never offered)."""
    return _offered[0] if _offered else None


def connect() -> Run:
    """This box's place in the run, once per script; refused outside a worker that dpeer started."""
    launch = taken()
    if launch is None:
        raise JobUsageError("dpeer.job.connect() runs inside a worker that dpeer starts: run the script with "
                            "`dpeer start --job train.py` (or `dpeer demo --job train.py`), not with python")
    if launch.run is not None:
        raise JobUsageError("dpeer.job.connect() was called twice: call it once and keep the Run it returns")
    launch.run = Run(launch)
    return launch.run


class Named:
    """Several objects with ``state_dict``/``load_state_dict`` saved and healed as one, by name."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects

    def state_dict(self) -> dict[str, Any]:
        """Each object's state under its name."""
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load each object's state; a state that lacks one of them is refused."""
        missing = sorted(set(self.objects) - set(state))
        if missing:
            raise ValueError(f"the saved state has nothing for {', '.join(missing)}: was it saved by this script?")
        for name, obj in self.objects.items():
            obj.load_state_dict(state[name])


def _stateful(name: str, obj: Any) -> Any:
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise JobUsageError(f"run.register({name}=...) takes an object with state_dict() and load_state_dict(), "
                            f"got {type(obj).__name__}")
    return obj


class Run:
    """The run as one box's script sees it: its shape (from the config's ``training`` keys), where it
    is (``rank``, ``world``, ``is_writer``), and the loop over its steps."""

    def __init__(self, launch: Launch) -> None:
        self._launch = launch
        self.ctx = launch.ctx
        self._model: torch.nn.Module | None = None
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        self._others: dict[str, Any] = {}
        self._scaler: Any = None
        self.trainer: Trainer | None = None
        self.finished = False

    node_id = property(lambda self: self.ctx.node_id, doc="this box's node id")
    device = property(lambda self: self.ctx.device, doc="this worker's device: cuda:0 with a GPU, else cpu")
    seed = property(lambda self: self.ctx.seed, doc="training.seed: seed the model and data from it")
    lr = property(lambda self: self.ctx.lr, doc="training.lr")
    total_steps = property(lambda self: self.ctx.steps, doc="training.steps: the run's length")
    global_batch = property(lambda self: self.ctx.global_batch, doc="training.global_batch: samples a step")
    micro_batch = property(lambda self: self.ctx.micro_batch, doc="training.micro_batch: the DataLoader's batch_size")

    @property
    def model(self) -> torch.nn.Module | None:
        """The registered model (None before run.register)."""
        return self._model

    def option(self, key: str, default: Any) -> Any:
        """training.options[key] typed as ``default`` (bool, int, float, str), or ``default``."""
        return self.ctx.option(key, default)

    @property
    def rank(self) -> int:
        """This rank in the current group (-1 before the first group forms)."""
        m = self.trainer.group.membership if self.trainer is not None else None
        return m.rank if m is not None else -1

    @property
    def world(self) -> int:
        """The current group's size (0 before the first group forms)."""
        m = self.trainer.group.membership if self.trainer is not None else None
        return m.world if m is not None else 0

    @property
    def is_writer(self) -> bool:
        """Whether this rank writes the run's logs, evaluation results and "best" models: rank 0 of
        the current group, so one box does it, not every box."""
        return self.rank == 0

    def register(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scaler: Any = None, **state: Any) -> None:
        """What a heal copies and a checkpoint saves: the model, its optimizer (more as further
        ``name=optimizer`` keywords), a GradScaler, and any other object with ``state_dict`` and
        ``load_state_dict`` by name (schedulers, a data position, a carried hidden state)."""
        if self.trainer is not None or self._model is not None:
            raise JobUsageError("run.register() is called once, before run.steps()")
        if not isinstance(model, torch.nn.Module) or not any(p.requires_grad for p in model.parameters()):
            raise JobUsageError("run.register(model=...) takes a torch.nn.Module with trainable parameters")
        self._model, self._scaler = model, scaler
        if optimizer is not None:
            self._optimizers["optimizer"] = optimizer
        for name, obj in state.items():
            target = self._optimizers if isinstance(obj, torch.optim.Optimizer) else self._others
            target[name] = _stateful(name, obj)
        owned = {id(p) for p in model.parameters()}
        for name, opt in self._optimizers.items():
            if not {id(p) for g in opt.param_groups for p in g["params"]} <= owned:
                raise JobUsageError(f"optimizer {name!r} holds tensors that are not the model's parameters: build "
                                    f"it from model.parameters() after moving the model to run.device")

    def steps(self, loader: DataLoader, loss: str = "mean") -> Iterator[Step]:
        """The run's steps, from where the group is, to ``total_steps``; ``loader`` is the job's
        DataLoader (its batch_size must be ``micro_batch``; the runtime picks its samples), ``loss``
        how the job's loss reduces over a micro-batch: "mean" (torch's default) or "sum"."""
        if self._model is None:
            raise JobUsageError("call run.register(model=..., optimizer=...) before run.steps()")
        if self.trainer is not None:
            raise JobUsageError("run.steps() is called once: the loop over it is the whole run")
        if loss not in ("mean", "sum"):
            raise JobUsageError(f"run.steps(loss=...) is 'mean' or 'sum', got {loss!r}")
        self.trainer = self._trainer(loader, loss == "mean")
        yield from self.trainer.steps()
        self.finished = self.trainer.step >= self.total_steps

    def _trainer(self, loader: DataLoader, mean: bool) -> Trainer:
        """The runtime's loop over this script's state and data, reported built to the daemon."""
        launch, t0 = self._launch, time.monotonic()
        feed = LoaderFeed(loader, self.micro_batch, self.seed)
        if launch.init_from:
            only = next(iter(self._optimizers.values())) if len(self._optimizers) == 1 else None
            print(f"dpeer worker: starting from {load_initial(launch.init_from, self._model, only)}", flush=True)
        optimizers = Named(self._optimizers)
        spec = TrainSpec(model=self._model, optimizer=optimizers, dataset=feed.dataset,  # type: ignore[arg-type]
                         loss_fn=None, global_batch=self.global_batch, micro_batch=self.micro_batch,
                         steps=self.total_steps, seed=self.seed, scheduler=Named(self._others), scaler=self._scaler)
        if len(spec.dataset) < 1:
            raise JobUsageError("the DataLoader's dataset is empty")
        trainer = Trainer(spec, launch.source, self.node_id, launch.config, store_socket=launch.store, feed=feed,
                          mean_loss=mean)
        launch.on_built(time.monotonic() - t0)
        return trainer

    def finish(self) -> int:
        """The script is done with the run: its final step, or JobUsageError when steps remain."""
        if not self.finished:
            at = self.trainer.step if self.trainer is not None else 0
            raise JobUsageError(f"the run ended at step {at} of {self.total_steps}: loop over every step of "
                                f"run.steps() (a `break` leaves the others untrained)")
        return self.total_steps

