"""The node runtime: the driver (driver.py) that feeds the membership and Raft cores, persists each
Ready and sends, and the chores that run on it (leader chores, member record, resync)."""
