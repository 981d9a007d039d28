"""The chaos run's linearizability checker (dpeer/chaos/linear.py), as tables: histories a correct
register can produce (concurrency, unknown outcomes) pass; stale reads, values never written and
deletes that come back fail; a search past its budget is reported, never passed."""

from __future__ import annotations

import itertools
import random

import pytest

from dpeer.chaos.linear import Kind, Op, Verdict, check_history, check_key
from tests.test_layers import IMPURE, ROOT, imports

NONE = None  # an operation without an answer: `ret` None


def put(value: str, call: float, ret: float | None, client: int = 1, key: str = "k") -> Op:
    return Op(client, Kind.PUT, key, call, ret, value=value)


def get(value: str | None, call: float, ret: float | None, client: int = 2, key: str = "k") -> Op:
    return Op(client, Kind.GET, key, call, ret, value=value)


def delete(found: bool | None, call: float, ret: float | None, client: int = 3, key: str = "k") -> Op:
    return Op(client, Kind.DELETE, key, call, ret, found=found)


LINEARIZABLE = [
    ("nothing happened", []),
    ("sequential put, get, delete, get", [put("a", 0, 1), get("a", 2, 3), delete(True, 4, 5), get(None, 6, 7)]),
    ("a read of a fresh key finds it absent", [get(None, 0, 1)]),
    ("a delete of a fresh key finds nothing", [delete(False, 0, 1), get(None, 2, 3)]),
    ("a read during a put sees the new value", [put("a", 0, 10), get("a", 1, 2)]),
    ("a read during a put sees the old value", [put("a", 0, 1), put("b", 2, 10), get("a", 3, 4), get("b", 11, 12)]),
    ("two concurrent puts, the first to start lands last",
     [put("a", 0, 10, client=1), put("b", 1, 9, client=2), get("a", 11, 12), get("a", 13, 14)]),
    ("reads during concurrent puts agree on one order",
     [put("a", 0, 10, client=1), put("b", 0, 10, client=2), get("b", 1, 2), get("a", 3, 4), get("a", 11, 12)]),
    ("a delete concurrent with a put finds it", [put("a", 0, 5), delete(True, 1, 6), get(None, 7, 8)]),
    ("a delete concurrent with a put misses it", [put("a", 0, 5), delete(False, 1, 6), get("a", 7, 8)]),
    ("touching in time counts as concurrent", [put("a", 0, 1), get("a", 1, 2)]),
    ("a put without an answer takes effect late",
     [put("a", 0, NONE), get(None, 1, 2), get(None, 3, 4), get("a", 5, 6), get("a", 7, 8)]),
    ("a put without an answer never takes effect", [put("a", 0, NONE), get(None, 5, 6), get(None, 7, 8)]),
    ("a delete without an answer takes effect late",
     [put("a", 0, 1), delete(NONE, 2, NONE), get("a", 3, 4), get(None, 5, 6)]),
    ("a delete without an answer explains a later absent read, a put then lands",
     [put("a", 0, 1), delete(NONE, 2, NONE), get(None, 3, 4), put("b", 5, 6), get("b", 7, 8)]),
    ("a delete's answer means nothing without a return", [delete(True, 0, NONE), get(None, 1, 2)]),
    ("a read without an answer is left out", [put("a", 0, 1), get("zzz", 2, NONE), get("a", 3, 4)]),
    ("keys are independent", [put("a", 0, 1, key="x"), get(None, 2, 3, key="y"), get("a", 2, 3, key="x")]),
    ("a put without an answer lets a delete find the key",
     [put("a", 0, NONE), delete(True, 3, 4), get(None, 5, 6)]),
]

NOT_LINEARIZABLE = [
    ("a stale read after an acknowledged write", [put("a", 0, 1), put("b", 2, 3), get("a", 4, 5)], "'a'"),
    ("a read of a value never written", [put("a", 0, 1), get("x", 2, 3)], "'x'"),
    ("a delete that reappears", [put("a", 0, 1), delete(True, 2, 3), get("a", 4, 5)], "get -> 'a'"),
    ("an acknowledged put read as absent", [put("a", 0, 1), get(None, 2, 3)], "absent"),
    ("a delete that misses an acknowledged put", [put("a", 0, 1), delete(False, 2, 3)], "not found"),
    ("two deletes find one put", [put("a", 0, 1), delete(True, 2, 3), delete(True, 4, 5)], "found"),
    ("a read goes back to an older value after the newer was seen",
     [put("a", 0, 1), put("b", 2, 10), get("b", 3, 4), get("a", 5, 6)], "'a'"),
    ("a put without an answer cannot explain a read before it was invoked",
     [get("a", 0, 1), put("a", 2, NONE)], "'a'"),
    ("a delete without an answer cannot bring back an old value",
     [put("a", 0, 1), put("b", 2, 3), delete(NONE, 4, NONE), get("a", 5, 6)], "'a'"),
]


@pytest.mark.parametrize("why, ops", LINEARIZABLE, ids=[w for w, _ in LINEARIZABLE])
def test_linearizable_histories_pass(why: str, ops: list[Op]) -> None:
    result = check_history(ops)
    assert result.problems() == [], why
    assert all(k.verdict is Verdict.LINEARIZABLE for k in result.keys)


@pytest.mark.parametrize("why, ops, named", NOT_LINEARIZABLE, ids=[w for w, _, _ in NOT_LINEARIZABLE])
def test_broken_histories_fail_and_say_why(why: str, ops: list[Op], named: str) -> None:
    problems = check_history(ops).problems()
    assert len(problems) == 1, why
    assert problems[0].startswith("key 'k': not linearizable") and named in problems[0], problems[0]


def test_the_figures_count_operations_keys_unknowns_and_states() -> None:
    ops = [put("a", 0, 1), put("b", 0, NONE, key="y"), get("a", 2, 3), get("q", 4, NONE), delete(True, 5, 6)]
    result = check_history(ops)
    assert (result.ops, len(result.keys), result.unknown, result.dropped_reads) == (4, 2, 1, 1)
    assert result.states == 3  # the unanswered put of 'b' no read saw is left out of the search
    assert result.note() == (f"4 operations on 2 keys (1 without an answer, 1 unanswered reads left out), "
                             f"{result.states} search states")


def test_a_search_over_its_budget_is_reported_not_passed() -> None:
    ops = [put(f"v{i}", 0, 10, client=i) for i in range(8)] + [get("v3", 11, 12)]
    assert check_key("k", ops).verdict is Verdict.LINEARIZABLE
    unfinished = check_key("k", ops, max_states=5)
    assert unfinished.verdict is Verdict.UNFINISHED and unfinished.states == 5
    problems = check_history(ops, max_states=5).problems()
    assert problems == ["key 'k': the search stopped after 5 states without a verdict (9 operations): not checked"]


def _register_run(seed: int, clients: int, count: int) -> list[Op]:
    """A history a correct register produces: each operation takes effect at a random point
    between its call and its return (a few never answer: some take effect, some never)."""
    rng = random.Random(seed)
    free = [0.0] * clients
    planned = []
    for n in range(count):
        c = rng.randrange(clients)
        call = free[c] + rng.uniform(0, 1)
        ret = call + rng.uniform(0.01, 3)
        kind = rng.choice([Kind.PUT, Kind.GET, Kind.GET, Kind.DELETE])
        answered = rng.random() > 0.05
        at = rng.uniform(call, ret) if answered or rng.random() < 0.5 else float("inf")
        free[c] = ret if answered else call + 0.5
        planned.append((at, n, c, kind, call, ret if answered else None))
    state, ops = None, []
    for at, n, c, kind, call, ret in sorted(planned):
        if kind is Kind.PUT:
            state, op = f"v{n}", Op(c, kind, "k", call, ret, value=f"v{n}")
        elif kind is Kind.GET:
            op = Op(c, kind, "k", call, ret, value=state)
        else:
            op, state = Op(c, kind, "k", call, ret, found=state is not None), None
        ops.append(op)
    return ops


@pytest.mark.parametrize("seed", range(5))
def test_long_concurrent_histories_of_a_correct_register_pass_within_the_budget(seed: int) -> None:
    ops = _register_run(seed, clients=4, count=300)
    result = check_key("k", ops)
    assert result.verdict is Verdict.LINEARIZABLE, result.why
    assert result.states < 5_000


@pytest.mark.parametrize("seed", range(3))
def test_a_stale_read_at_the_end_of_a_long_concurrent_history_is_found(seed: int) -> None:
    ops = _register_run(seed, clients=4, count=300)
    written = [o.value for o in ops if o.kind is Kind.PUT]
    end = max(o.ret or o.call for o in ops)
    result = check_key("k", ops + [get(written[len(written) // 2], end + 1, end + 2, client=9)])
    assert result.verdict is Verdict.VIOLATION
    assert f"cannot take get -> {written[len(written) // 2]!r} by client 9" in result.why


def _brute_force(ops: list[Op]) -> bool:
    """Linearizable by the definition: some order of the answered operations and some of the
    unanswered writes that respects real time and the register."""
    ops = [o for o in ops if o.ret is not None or o.kind is not Kind.GET]
    answered = [o for o in ops if o.ret is not None]
    optional = [o for o in ops if o.ret is None]
    for mask in range(1 << len(optional)):
        chosen = answered + [o for j, o in enumerate(optional) if mask >> j & 1]
        for order in itertools.permutations(chosen):
            if _fits(order):
                return True
    return False


def _fits(order: tuple[Op, ...]) -> bool:
    for a, b in itertools.combinations(order, 2):  # a before b: b must not have returned before a was called
        if b.ret is not None and b.ret < a.call:
            return False
    state = None
    for op in order:
        if op.kind is Kind.PUT:
            state = op.value
        elif op.kind is Kind.GET:
            if op.value != state:
                return False
        else:
            if op.ret is not None and op.found != (state is not None):
                return False
            state = None
    return True


def _random_history(rng: random.Random) -> list[Op]:
    ops = []
    for n in range(rng.randint(1, 6)):
        call = float(rng.randint(0, 8))
        ret = None if rng.random() < 0.25 else call + rng.randint(0, 4)
        kind = rng.choice(list(Kind))
        if kind is Kind.PUT:
            ops.append(Op(n, kind, "k", call, ret, value=rng.choice("abc")))
        elif kind is Kind.GET:
            ops.append(Op(n, kind, "k", call, ret, value=rng.choice(["a", "b", "c", None])))
        else:
            ops.append(Op(n, kind, "k", call, ret, found=rng.random() < 0.5))
    return ops


def test_the_search_agrees_with_the_definition_on_random_small_histories() -> None:
    """Narrowing, twins and the merged unread state change no verdict: 3,000 random histories
    (shared values, unanswered operations, ties in time) against trying every order."""
    rng = random.Random(35)
    verdicts = {True: 0, False: 0}
    for _ in range(3000):
        ops = _random_history(rng)
        expected = _brute_force(ops)
        assert (check_key("k", ops).verdict is Verdict.LINEARIZABLE) == expected, ops
        verdicts[expected] += 1
    assert min(verdicts.values()) > 500, verdicts


def test_the_checker_is_a_pure_core() -> None:
    bad = {n.split(".")[0] for n in imports(ROOT / "chaos" / "linear.py")} & IMPURE
    assert not bad, f"chaos/linear.py imports {sorted(bad)}"
