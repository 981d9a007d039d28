"""Helpers the tests share: real daemons driven through the CLI (daemons.py), local clusters
(cluster.py), training through them (training.py), a test PKI and raw channels (pki.py), chaos
runs (chaos.py), ExactStep in one process (exact.py, with its 1-rank group fixture) and the
trainer's state as the heal takes it (heal_state.py), a hand-driven network of Raft cores
(raft_net.py), the state machine's entry builders (sm_entries.py), worker processes under a fake
view authority (trainer_cluster.py), clocks the tests move (clocks.py), a recording WorkerEvents
(worker_events.py) and daemons in network namespaces (netns_boxes.py). Per-folder fixtures stay
in conftest.py."""
