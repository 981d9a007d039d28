"""Helpers the tests share. Per-folder fixtures stay in conftest.py.

The cluster harnesses, one per kind of cluster (use the cheapest that shows the behaviour):
- Raft cores, simulated: tests/consensus/raft_net.py `RaftNet` moves by hand (tick one node,
  deliver, cut or rewrite a message) for step-by-step tests; tests/consensus/raft_sim.py
  `RaftCluster` runs the same nodes and disks on dpeer.sim's Simulator under seeded chaos (crash,
  wipe, partition, loss, pause, force, a failure-detector and leader-chores model) for the safety
  and liveness schedules. Both check Raft's invariants at every persisted Ready.
- SWIM membership, simulated: tests/membership/cluster.py `SwimCluster`, gossip members on the
  Simulator with effect logs and invariants, for detection and dissemination.
- Whole daemons, simulated: tests/house/cluster.py `House`, N real Daemons (driver, chores,
  services, LMDB store) on the virtual clock and the in-memory network, for what the layers do
  together under crashes, torn writes and partitions, seeded and fast.
- Real processes: daemons.py `Daemons`, `dpeer start` daemons on 127.0.0.1 that a test starts,
  signals, kills, restarts and reads (a LocalCluster of n1..nN, or daemons of its own), with CLI
  calls and status waits; the `daemons` and `make_cluster` fixtures build it. For the operating
  surface and end-to-end behaviour that only real processes show (slow: seconds per daemon).
- Workers without daemons: trainer_cluster.py `Cluster`, real worker processes fed views through
  a directory by a fake view authority, for the trainer's multi-process behaviour alone.
- Daemons in network namespaces: netns_boxes.py `Boxes` (root only), for real link cuts.

Also: training through real daemons (training.py), a test PKI and raw channels (pki.py), chaos
runs (chaos.py), ExactStep in one process (exact.py, with its 1-rank group fixture), the
trainer's state as the heal takes it (heal_state.py), the state machine's entry builders
(sm_entries.py), clocks the tests move (clocks.py), a recording WorkerEvents (worker_events.py)
and a disk that tears writes (disk.py)."""
