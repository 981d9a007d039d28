"""Is a kv history linearizable? Wing and Gong's search with Lowe's memoisation, per key.

Each key is a register that starts absent: `put` sets it, `get` answers its value (or absent),
`delete` removes it and answers whether it was there. An operation is seen from its client: the
time it was invoked and the time its answer came (`ret`). One without an answer (a timeout, an
unreachable node) may take effect at any time after its invocation, or never: its return is put
at infinity, where taking effect last and never are the same to every other operation; a read
without an answer changes nothing and is left out. Keys are independent (a history is
linearizable when each key's is), so each key is searched alone, which keeps the search small.
Unanswered writes multiply the states, so before the search each is narrowed where that changes
no verdict (`narrow`): one whose effect no answer could show is left out, and the only put of a
value that a read saw must take effect before that read answered.

The search (as porcupine does it) walks a list of call and return events in time order, tries to
linearize the earliest pending call whose effect fits the state, backtracks when it meets the
return of an operation it has not linearized, and never revisits a (linearized set, state) pair.
It stops after `max_states` new pairs per key: an unfinished key is reported, never passed.
Pure: no clock, I/O or framework; the chaos run records the history (dpeer/chaos/history.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

MAX_STATES = 500_000  # per key: about 80 MB and 5 s of search at most


class Kind(str, Enum):
    """What an operation does to its key."""

    PUT = "put"
    GET = "get"
    DELETE = "delete"


@dataclass(frozen=True)
class Op:
    """One operation as its client saw it (times in seconds on one monotonic clock). `value`: the
    value a put wrote or a get read (None: the get found the key absent). `found`: a delete's
    answer. `ret` None: no answer came; `value` of a get and `found` then mean nothing."""

    client: int
    kind: Kind
    key: str
    call: float
    ret: float | None
    value: str | None = None
    found: bool | None = None
    node: str = ""

    def describe(self) -> str:
        """One line: what the client asked, what came back, and when."""
        if self.kind is Kind.PUT:
            what = f"put {self.value!r}"
        elif self.kind is Kind.DELETE:
            what = "delete" + ("" if self.ret is None else (" (found)" if self.found else " (not found)"))
        else:
            what = "get -> " + ("absent" if self.value is None else repr(self.value))
        end = "no answer" if self.ret is None else f"{self.ret:.3f}s"
        via = f" through {self.node}" if self.node else ""
        return f"{what} by client {self.client}{via} ({self.call:.3f}s to {end})"


class Verdict(str, Enum):
    """A key's outcome."""

    LINEARIZABLE = "linearizable"
    VIOLATION = "not linearizable"
    UNFINISHED = "unfinished"


@dataclass
class KeyResult:
    """A key's verdict, the (linearized set, state) pairs the search visited, and, for a
    violation, why the furthest order found could not go on."""

    key: str
    ops: int
    verdict: Verdict
    states: int
    why: str = ""


@dataclass
class HistoryResult:
    """Every key's result and the history's figures."""

    keys: list[KeyResult] = field(default_factory=list)
    ops: int = 0
    unknown: int = 0
    dropped_reads: int = 0

    @property
    def states(self) -> int:
        """Search states over every key."""
        return sum(k.states for k in self.keys)

    def problems(self) -> list[str]:
        """One line per key that is not linearizable or whose search did not finish."""
        return [f"key {k.key!r}: {k.why}" for k in self.keys if k.verdict is not Verdict.LINEARIZABLE]

    def note(self) -> str:
        """What the check covered (the report's figures)."""
        return (f"{self.ops} operations on {len(self.keys)} keys ({self.unknown} without an answer, "
                f"{self.dropped_reads} unanswered reads left out), {self.states} search states")


def check_history(ops: list[Op], max_states: int = MAX_STATES) -> HistoryResult:
    """Check every key's history; the result says which keys are not linearizable, and why."""
    by_key: dict[str, list[Op]] = {}
    result = HistoryResult()
    for op in ops:
        if op.kind is Kind.GET and op.ret is None:
            result.dropped_reads += 1
            continue
        by_key.setdefault(op.key, []).append(op)
        result.ops += 1
        result.unknown += op.ret is None
    result.keys = [check_key(key, key_ops, max_states) for key, key_ops in sorted(by_key.items())]
    return result


class Unread(Enum):
    """The state of a key holding a value no read saw: all such values look alike to every
    later operation, so the search keeps them as one state."""

    VALUE = "a value no read saw"


State = str | None | Unread


def step(state: State, op: Op, written: State) -> tuple[bool, State]:
    """Whether `op` may take effect on a register holding `state` (None: absent), and the state
    after; `written` is what a put leaves (its value, or Unread.VALUE)."""
    if op.kind is Kind.PUT:
        return True, written
    if op.kind is Kind.GET:
        return op.value == state, state
    return op.ret is None or op.found == (state is not None), None


@dataclass
class _Key:
    """One key's operations as the search takes them: each with the time by which it must have
    taken effect, the state a put leaves, and its twin (the previous unanswered operation of the
    same effect, by call time; -1: none): twins take effect in call order, any order of them
    being the same to everything else."""

    ops: list[Op]
    due: list[float]
    writes: list[State]
    twin: list[int]


def prepare(ops: list[Op]) -> _Key:
    """Narrow a key's operations (see `narrow`) and find the written states and the twins."""
    kept = narrow(ops)
    read = {o.value for o, _ in kept if o.kind is Kind.GET}
    writes: list[State] = [o.value if o.value in read else Unread.VALUE for o, _ in kept]
    twin, last = [-1] * len(kept), {}
    for i in sorted(range(len(kept)), key=lambda i: kept[i][0].call):
        op, due = kept[i]
        if due == float("inf") and (op.kind is Kind.DELETE or writes[i] is Unread.VALUE):
            twin[i] = last.get(op.kind, -1)
            last[op.kind] = i
    return _Key([o for o, _ in kept], [d for _, d in kept], writes, twin)


class _Event:
    """A call or a return in the doubly linked event list."""

    __slots__ = ("op", "is_call", "match", "prev", "next")

    def __init__(self, op: int, is_call: bool) -> None:
        self.op = op
        self.is_call = is_call
        self.match: _Event | None = None
        self.prev: _Event | None = None
        self.next: _Event | None = None


def narrow(ops: list[Op]) -> list[tuple[Op, float]]:
    """Each operation with the time by which it must have taken effect (its return; infinity for
    one without an answer), narrowed where no verdict changes: an unanswered read is left out (it
    changes nothing); so is an unanswered put whose value no read saw, with no delete that
    answered "found" after its call (all it could do is hold an unread value until the next
    write), and an unanswered delete with no read that answered absent and no delete that
    answered "not found" after its call; the only put of a value that reads saw must take effect
    before the first of those reads answered."""
    answered = [o for o in ops if o.ret is not None]
    first_read: dict[str | None, float] = {}
    for o in answered:
        if o.kind is Kind.GET and o.ret is not None:
            first_read[o.value] = min(first_read.get(o.value, o.ret), o.ret)
    writers = [o.value for o in ops if o.kind is Kind.PUT]
    out: list[tuple[Op, float]] = []
    for op in ops:
        if op.ret is not None:
            out.append((op, op.ret))
            continue
        later = [o for o in answered if o.ret is not None and o.ret >= op.call]
        if op.kind is Kind.DELETE:
            if any((o.kind is Kind.GET and o.value is None) or (o.kind is Kind.DELETE and not o.found) for o in later):
                out.append((op, float("inf")))
        elif op.kind is Kind.PUT and op.value in first_read:
            seen = first_read[op.value]
            out.append((op, seen if writers.count(op.value) == 1 and seen >= op.call else float("inf")))
        elif op.kind is Kind.PUT and any(o.kind is Kind.DELETE and o.found for o in later):
            out.append((op, float("inf")))
    return out


def _events(key: _Key) -> _Event:
    """The list head: calls and returns in time order, a call before a return at the same time
    (so operations that touch in time count as concurrent)."""
    marks = []
    for i, (op, due) in enumerate(zip(key.ops, key.due)):
        marks.append((op.call, 0, i))
        marks.append((due, 1, i))
    marks.sort()
    head = _Event(-1, False)
    calls: dict[int, _Event] = {}
    last = head
    for _, is_return, i in marks:
        ev = _Event(i, not is_return)
        if is_return:
            calls[i].match = ev
        else:
            calls[i] = ev
        ev.prev, last.next = last, ev
        last = ev
    return head


def _lift(call: _Event) -> None:
    """Take a call and its return out of the list (they keep their links for _unlift)."""
    for ev in (call, call.match):
        assert ev is not None and ev.prev is not None
        ev.prev.next = ev.next
        if ev.next is not None:
            ev.next.prev = ev.prev


def _unlift(call: _Event) -> None:
    """Put back what _lift took out (in the reverse order)."""
    for ev in (call.match, call):
        assert ev is not None and ev.prev is not None
        ev.prev.next = ev
        if ev.next is not None:
            ev.next.prev = ev


def check_key(name: str, ops: list[Op], max_states: int = MAX_STATES) -> KeyResult:
    """Search for an order of one key's operations that respects real time and the register."""
    key = prepare(ops)
    head = _events(key)
    state: State = None
    linearized = 0
    stack: list[tuple[_Event, State]] = []
    seen: set[tuple[int, State]] = set()
    furthest: tuple[int, int, State] = (-1, -1, None)  # (depth, operation stuck at, state there)
    entry = head.next
    while head.next is not None:
        assert entry is not None
        i = entry.op
        if entry.is_call:
            ok, after = step(state, key.ops[i], key.writes[i])
            ok = ok and (key.twin[i] < 0 or bool(linearized >> key.twin[i] & 1))
            if ok and (linearized | 1 << i, after) not in seen:
                if len(seen) >= max_states:
                    return KeyResult(name, len(ops), Verdict.UNFINISHED, len(seen),
                                     f"the search stopped after {max_states} states without a verdict "
                                     f"({len(ops)} operations): not checked")
                seen.add((linearized | 1 << i, after))
                stack.append((entry, state))
                state, linearized = after, linearized | 1 << i
                _lift(entry)
                entry = head.next
                continue
            entry = entry.next
            continue
        if len(stack) > furthest[0]:
            furthest = (len(stack), i, state)
        if not stack:
            return KeyResult(name, len(ops), Verdict.VIOLATION, len(seen), _why(key, furthest))
        entry, state = stack.pop()
        linearized &= ~(1 << entry.op)
        _unlift(entry)
        entry = entry.next
    return KeyResult(name, len(ops), Verdict.LINEARIZABLE, len(seen))


def _why(key: _Key, furthest: tuple[int, int, State]) -> str:
    """The furthest order found, and the operation that could not follow it."""
    depth, stuck, state = furthest
    held = "absent" if state is None else state.value if isinstance(state, Unread) else repr(state)
    return (f"not linearizable: the furthest order found takes {depth} of {len(key.ops)} operations, the key "
            f"then {held}, and cannot take {key.ops[stuck].describe()} before it answered")
