"""The daemon's side of its worker process: start and restart it (supervisor, warm spare), carry
its output into the logs, wake the loop when it reports, fetch the final state it resumes from."""
