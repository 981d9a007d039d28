"""One node's daemon (docs/architecture.md, "Layers"), in folders by what each part owns.

decide/  the pure decisions the drivers act on (no I/O, clock or framework; no driver imported)
node/    the node runtime: the driver that feeds the membership and Raft cores, persists and sends,
         and the chores it runs (the leader's, the member record, resync)
worker/  the daemon's side of its worker process: supervisor, warm spare, output, wake, final state
serve/   what the node answers: the Peer RPC service, the status document, /metrics
Here: the daemon that assembles them (daemon.py, run.py) and what it starts from (config,
timing, job name, data dir, logs, systemd notify).
"""
