"""dpeer's API for a training script of your own (``dpeer start --job train.py``):

    run = dpeer.job.connect()
    run.register(model=model, optimizer=optimizer, scheduler=scheduler)
    for step in run.steps(loader):
        with step:
            for x, y in step.micro_batches():
                step.backward(loss_fn(model(x), y))
            optimizer.step()

A streaming (iterable) dataset is read in order, its position following the step; a corpus read as
parallel streams with a carried state (truncated BPTT) uses ``run.steps(loader, order="streams")``
and ``Carried`` (docs/data.md).

docs/jobs.md is the guide; dpeer/trainer/step.py and script.py say what each call guarantees.
"""

from dpeer.trainer.carry import Carried, CarryUsageError
from dpeer.trainer.script import JobUsageError, Run, connect
from dpeer.trainer.step import Step, StepUsageError
from dpeer.trainer.stream import ShardedStream, StreamEnded

__all__ = ["Carried", "CarryUsageError", "JobUsageError", "Run", "ShardedStream", "Step", "StepUsageError",
           "StreamEnded", "connect"]
