"""The training side: worker, group (re)formation, healing, exact-once data, checkpoints.

Contract with the daemon (nothing here imports ``dpeer.daemon``):

- The daemon starts ``python -m dpeer.trainer.worker --node-id ID --job demo|MODULE:FUNCTION
  --views SPEC`` (or DPEER_NODE_ID / DPEER_JOB / DPEER_VIEWS). ``SPEC`` is ``dir:PATH`` (the
  file-based source used in tests) or ``py:MODULE:FACTORY[:ARG]``, which calls
  ``FACTORY(ARG, node_id)`` and must return a ``viewsource.ViewSource``.
- ``ViewSource.wait_view(after_generation, timeout)`` returns the newest committed view with a
  higher generation (a ``channel.local.Assignment``: the ``dpeer.view.View`` the log committed,
  the checkpoint to resume from, the address to bind), or None on timeout; ``timeout=0`` is a
  non-blocking peek made once per step.
  The worker builds the job before its first blocking ``wait_view``, so that first call is its
  request to join. ``report_failure(reason, generation)`` says the group of that generation failed;
  ``report_progress(step, samples, loss, params_digest)`` follows every committed step; the
  digest (sha256 of the parameters, then the buffers) is empty except every ``digest_every``
  steps, at a group's first step and the last.
  A source may also offer ``committed_checkpoint() -> (step, digest)``, the newest checkpoint the
  log recorded, which the worker resumes from before its first ``wait_view``.
- ``View.store`` (host, port) is hosted by the worker of ``members[0]`` (bound to exactly that
  address); it must be free on that host. Exit codes of the worker: 0 done, 1 no usable view
  within the idle limit, 2 bad usage, 75 the NCCL abort watchdog fired (restart it).
"""
