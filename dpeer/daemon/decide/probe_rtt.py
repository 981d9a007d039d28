"""Round trips of SWIM's direct probes, per member: the last heartbeat RTT `dpeer status` shows,
and the last few, from which a box judges which of its links are near (daemon/decide/sites.py).

The node notes when it sent each direct Ping and, when the probed node's own Ack for that
sequence number comes back, how long it took. Pure bookkeeping on the caller's clock.
"""

from __future__ import annotations

from collections import deque

MAX_OUTSTANDING = 1024
RECENT = 16  # round trips kept per member for sites.near_peers' floor


class ProbeTimes:
    """Outstanding probes (target, seq) -> send time, and each member's last measured round trip."""

    def __init__(self) -> None:
        self._sent: dict[tuple[str, int], float] = {}
        self.last: dict[str, float] = {}
        self._recent: dict[str, deque[float]] = {}

    def sent(self, target: str, seq: int, now: float) -> None:
        """A direct Ping with `seq` went to `target`."""
        if len(self._sent) >= MAX_OUTSTANDING:  # acks that never came (a dead member) age out
            for key in list(self._sent)[: MAX_OUTSTANDING // 2]:
                del self._sent[key]
        self._sent[(target, seq)] = now

    def acked(self, node: str, seq: int, now: float) -> None:
        """`node` itself answered the Ping `seq`: record the round trip (relayed acks are ignored)."""
        started = self._sent.pop((node, seq), None)
        if started is not None and now >= started:
            self.last[node] = now - started
            self._recent.setdefault(node, deque(maxlen=RECENT)).append(now - started)

    def rtt_ms(self, node: str) -> float | None:
        """The last round trip to `node` in milliseconds, or None before any."""
        seconds = self.last.get(node)
        return None if seconds is None else round(seconds * 1000.0, 2)

    def recent_ms(self) -> dict[str, list[float]]:
        """The last RECENT round trips to each member, in milliseconds."""
        return {node: [s * 1000.0 for s in times] for node, times in self._recent.items()}
