"""dpeer's API for a training script of your own (``dpeer start --job train.py``):

    run = dpeer.job.connect()
    run.register(model=model, optimizer=optimizer, scheduler=scheduler)
    for step in run.steps(loader):
        with step:
            for x, y in step.micro_batches():
                step.backward(loss_fn(model(x), y))
            optimizer.step()

docs/jobs.md is the guide; dpeer/trainer/step.py and script.py say what each call guarantees.
"""

from dpeer.trainer.script import JobUsageError, Run, connect
from dpeer.trainer.step import Step, StepUsageError

__all__ = ["JobUsageError", "Run", "Step", "StepUsageError", "connect"]
