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
from torch.utils.data import DataLoader, IterableDataset

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.carry import Carried
from dpeer.trainer.feed import LoaderFeed
from dpeer.trainer.group import GroupSeat
from dpeer.trainer.job_api import JobContext, TrainSpec
from dpeer.trainer.loop import LoopConfig, Trainer
from dpeer.trainer.portable import load_initial
from dpeer.trainer.sampler import InOrderSampler, StreamsSampler
from dpeer.trainer.step import Step
from dpeer.trainer.stream import StreamReader, stream_length
from dpeer.trainer.viewsource import ViewSource

ORDERS = ("shuffle", "sequential", "streams")


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


class InitialOptimizers(Named):
    """The registered optimizers as a starting point fills them: a script job's own checkpoint holds
    them by name (Named); a plain script's file holds one optimizer's state, which fits a script
    that registered exactly one."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """By name when the names match; one optimizer's own state into the only one; else ValueError."""
        if set(state) == set(self.objects):
            super().load_state_dict(state)
        elif len(self.objects) == 1:
            next(iter(self.objects.values())).load_state_dict(state)
        else:
            raise ValueError(f"the file's optimizer state names {sorted(map(str, state))}, the script registered "
                             f"{sorted(self.objects)}")


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

    def steps(self, loader: DataLoader, loss: str = "mean", order: str | None = None) -> Iterator[Step]:
        """The run's steps, from where the group is, to ``total_steps``; ``loader`` is the job's
        DataLoader (its batch_size must be ``micro_batch``; the runtime picks its samples), ``loss``
        how the job's loss reduces over a micro-batch: "mean" (torch's default) or "sum".

        ``order``, which samples a step holds (docs/data.md): "shuffle" (a map-style dataset's
        default: a seeded permutation per epoch), "sequential" (in order: step s holds items
        [s*B, (s+1)*B); the only order of an iterable dataset, whose position follows the step),
        "streams" (the dataset's windows as global_batch parallel streams, for a carry.Carried)."""
        if self._model is None:
            raise JobUsageError("call run.register(model=..., optimizer=...) before run.steps()")
        if self.trainer is not None:
            raise JobUsageError("run.steps() is called once: the loop over it is the whole run")
        if loss not in ("mean", "sum"):
            raise JobUsageError(f"run.steps(loss=...) is 'mean' or 'sum', got {loss!r}")
        if order is not None and order not in ORDERS:
            raise JobUsageError(f"run.steps(order=...) is one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.trainer = self._trainer(loader, loss == "mean", order)
        yield from self.trainer.steps()
        self.finished = self.trainer.step >= self.total_steps

    def _order(self, loader: DataLoader, order: str | None) -> tuple[Any, Any]:
        """The sampler of ``order`` (None: the trainer's seeded one) and the dataset the feed reads."""
        dataset, batch = loader.dataset, self.global_batch
        if isinstance(dataset, IterableDataset):
            if order not in (None, "sequential"):
                raise JobUsageError(f"an iterable dataset is read in its own order: run.steps(order={order!r}) takes a "
                                    f"map-style Dataset (shuffle a stream from its set_epoch(epoch) instead)")
            length = stream_length(dataset)
            if length is not None and length < 1:
                raise JobUsageError("the DataLoader's dataset is empty")
            n = length if length is not None else self.total_steps * batch
            if n < batch:
                raise JobUsageError(f"the stream has {n} items, fewer than training.global_batch ({batch}): a step "
                                    f"would read an item twice")
            sampler = InOrderSampler(n, batch, self.seed)
            return sampler, StreamReader(dataset, n, sampler, type(dataset).__name__, length is not None, self.seed)
        if len(dataset) < 1:
            raise JobUsageError("the DataLoader's dataset is empty")
        if order == "sequential":
            if len(dataset) < batch:
                raise JobUsageError(f"the dataset has {len(dataset)} samples, fewer than training.global_batch "
                                    f"({batch})")
            return InOrderSampler(len(dataset), batch, self.seed), None
        if order == "streams":
            if len(dataset) < batch:
                raise JobUsageError(f"order='streams' needs a window per stream at least: the dataset has "
                                    f"{len(dataset)} windows for {batch} streams (training.global_batch)")
            return StreamsSampler(len(dataset), batch, self.seed), None
        return None, None

    def _trainer(self, loader: DataLoader, mean: bool, order: str | None = None) -> Trainer:
        """The runtime's loop over this script's state and data, reported built to the daemon."""
        launch, t0 = self._launch, time.monotonic()
        sampler, reader = self._order(loader, order)
        feed = LoaderFeed(loader, self.micro_batch, self.seed, dataset=reader)
        if launch.init_from:
            took = load_initial(launch.init_from, self._model, InitialOptimizers(self._optimizers))
            print(f"dpeer worker: starting from {took}", flush=True)
        optimizers = Named(self._optimizers)
        spec = TrainSpec(model=self._model, optimizer=optimizers, dataset=feed.dataset,  # type: ignore[arg-type]
                         loss_fn=None, global_batch=self.global_batch, micro_batch=self.micro_batch,
                         steps=self.total_steps, seed=self.seed, scheduler=Named(self._others), scaler=self._scaler)
        carried = {name: obj for name, obj in self._others.items() if isinstance(obj, Carried)}
        if carried and order != "streams":
            raise JobUsageError(f"{', '.join(carried)}: a Carried state needs run.steps(loader, order='streams'), "
                                f"whose steps hold one window of every stream")
        trainer = ScriptTrainer(spec, launch.source, self.node_id, launch.config, store_socket=launch.store,
                                feed=feed, mean_loss=mean, sampler=sampler, carried=carried)
        launch.on_built(time.monotonic() - t0)
        return trainer

    def finish(self) -> int:
        """The script is done with the run: its final step, or JobUsageError when steps remain."""
        if not self.finished:
            at = self.trainer.step if self.trainer is not None else 0
            raise JobUsageError(f"the run ended at step {at} of {self.total_steps}: loop over every step of "
                                f"run.steps() (a `break` leaves the others untrained)")
        return self.total_steps



class ScriptTrainer(Trainer):
    """The loop of a script job: the order its steps read (``sampler``: None, the seeded shuffle) and
    the carried states it shares in each step (carry.Carried): before the step's gradient sum
    completes, so a step is committed with its rows or redone without them."""

    def __init__(self, spec: TrainSpec, source: ViewSource, node_id: str, config: LoopConfig | None = None,
                 store_socket: socket.socket | None = None, feed: LoaderFeed | None = None, mean_loss: bool = False,
                 sampler: Any = None, carried: dict[str, Carried] | None = None) -> None:
        super().__init__(spec, source, node_id, config, store_socket=store_socket, feed=feed, mean_loss=mean_loss)
        if sampler is not None:  # the stepper plans from it, the ledger records it, progress counts it
            self.sampler = self.stepper.sampler = sampler
        self.carried = list((carried or {}).values())
        for name, c in (carried or {}).items():
            try:
                c.bind(self, name)
            except RuntimeError as exc:
                raise JobUsageError(str(exc)) from None

    def begin_step(self, m: GroupSeat) -> Step:
        """Plan the step; the carried states forget what a failed try of it wrote."""
        for c in self.carried:
            c._clear(self.step)
        return super().begin_step(m)

    def reduce(self, m: GroupSeat) -> StepReduction | None:
        """Share the carried rows (once a step, under the watch), then wait for the gradients' sums."""
        if self.carried:
            streams = self.sampler.stream_of
            rows = [streams(i) for _, indices in self.stepper.planned() for i in indices]
            self.watched.arm(m)
            try:
                for c in self.carried:
                    c.share(rows)
            finally:
                self.watched.disarm()
        return super().reduce(m)

    def commit_step(self, m: GroupSeat, red: StepReduction) -> bool:
        """The carried rows of the step become the value before the step is counted (and checkpointed)."""
        for c in self.carried:
            c.commit(self.step)
        return super().commit_step(m, red)
