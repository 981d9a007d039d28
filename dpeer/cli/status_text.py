"""`dpeer status` and `dpeer members` as text, from the status document (pure: a dict in, lines out).

The text says what an operator asks first: is the job training, at which step, did it fail and
why, which boxes are kept out, and one line per member. `--json` prints the document itself.
"""

from __future__ import annotations

from typing import Any

from dpeer.statemachine.payloads import MAX_SPEED_CLASS, MIN_SPEED_CLASS

HEADER = ("NODE", "ADDR", "STATE", "ROLE", "RANK", "STEP", "INC", "VERSION", "SITE", "SPEED", "SHARE")


def committed_step(doc: dict[str, Any]) -> int | None:
    """The newest step this node knows its group committed: the finished job's last step, else
    the newest step its worker reported (`train.latest_step`, never below the newest digested
    `train.step`: a restarted worker counts again from where it resumes); None while unknown."""
    job, train = doc.get("job") or {}, doc.get("train") or {}
    if job.get("state") == "finished" and isinstance(job.get("step"), int):
        return int(job["step"])
    steps = [s for s in (train.get("step"), train.get("latest_step")) if isinstance(s, int)]
    return max(steps) if steps else None


def member_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The members with what the table shows of each: `kind` (voter, learner or None while not
    committed), `role` (leader, else the kind), `rank` in the group this node trains in,
    `step`: the group's newest committed step for the group's members (a step commits on every
    rank at once), None for the others or while this node trains in no group, and `share`: its
    weight in the group's split of a step ("even" when the view splits evenly)."""
    voters, learners = set(doc.get("voters", ())), set(doc.get("learners", ()))
    group = doc.get("group") or {}
    group = group if isinstance(group, dict) else {}
    listed = group.get("members")
    ids = type(listed) is list and all(type(n) is str for n in listed)
    ranks = {n: i for i, n in enumerate(listed)} if ids else {}
    shares = _shares(group.get("shares"), len(ranks))
    step = committed_step(doc) if group else None
    rows = []
    for m in doc["members"]:
        node = m["node_id"]
        kind = "voter" if node in voters else "learner" if node in learners else None
        rank = ranks.get(node)
        share = None if rank is None or shares is None else shares[rank] if shares else "even"
        rows.append({**m, "kind": kind, "role": "leader" if node == doc.get("leader") else kind,
                     "rank": rank, "step": step if rank is not None else None, "share": share})
    return rows


def _shares(field: object, members: int) -> list | None:
    """The status field ``group.shares``: one weight per member in rank order, [] (or null) for an
    even split; what is not of that shape (a daemon of another version: not a list, not one per
    member, or not positive integer weights) is None, shown as unknown (never as "even", never
    raised on, and no cell of it ends the table's row)."""
    if field is None or field == []:
        return []
    weights = type(field) is list and all(type(s) is int and s >= 1 for s in field)
    return field if weights and len(field) == members else None


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _crossed(field: object) -> dict[str, tuple[int, int]]:
    """The status field ``cross_site_bytes`` ({process: {sent, received}}) as (sent, received) by
    process; what is not of that shape (a daemon of another version) is left out, not raised on."""
    if not isinstance(field, dict):
        return {}
    out = {}
    for process, counts in field.items():
        if isinstance(counts, dict) and all(isinstance(counts.get(k), int) for k in ("sent", "received")):
            out[str(process)] = (counts["sent"], counts["received"])
    return out


def _speed(speed_class: object) -> str:
    """A member's speed class as the micro-batches a second it stands for (2 ** (class / 4): a
    quarter octave a class, decide/speeds.py), "-" while unknown or not a class (out of the
    records' range too: 2 ** (5000 / 4) is no float)."""
    if type(speed_class) is not int or not MIN_SPEED_CLASS <= speed_class <= MAX_SPEED_CLASS:
        return "-"
    return f"{2 ** (speed_class / 4):.3g}/s"


def _size(count: int) -> str:
    """A byte count for people: 512 B, 1.5 KiB, 3.2 GiB."""
    size, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"


def members_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per member under a header, columns as wide as their widest cell; SPEED is the
    micro-batches a second of the member's committed speed class, SHARE its weight in a step."""
    cells = [list(HEADER)] + [[r["node_id"], r["addr"], r["state"], _cell(r["role"]), _cell(r["rank"]),
                               _cell(r["step"]), str(r["incarnation"]), str(r["version"]), _cell(r.get("site")),
                               _speed(r.get("speed_class")), _cell(r.get("share"))]
                              for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def job_lines(doc: dict[str, Any]) -> list[str]:
    """The job's state and step, a halted job's reason and what to do, this box's last failure
    and (on the leader) the boxes kept out of the group."""
    job = doc.get("job")
    if job is None:
        return ["job none (this node runs no job: `dpeer start --job`)"]
    step = committed_step(doc)
    if job["state"] == "failed":
        return [f"job failed: {job.get('error')}",
                "what to do: fix the cause on every box, then `dpeer job retry`"]
    lines = [f"job {job['state']}  step {_cell(step)}"
             + (f"  digest {job['digest']}" if job["state"] == "finished" and job.get("digest") else "")]
    if job.get("finishing"):
        lines.append(str(job["finishing"]))
    failure = job.get("last_failure")
    if failure:
        times = failure.get("repeats", 1)
        lines.append(f"last failure here: {failure.get('phase')} at step {failure.get('step')}, {times} time"
                     f"{'' if times == 1 else 's'} in a row: {failure.get('error')}")
    for box, error in sorted((job.get("kept_out") or {}).items()):
        lines.append(f"kept out of the group: {box}: {error}")
    return lines


def status_lines(doc: dict[str, Any]) -> list[str]:
    """`dpeer status` without --json."""
    lines = [f"node {doc['node_id']}  role {doc['role']}  term {doc['term']}  leader {doc['leader']}",
             f"commit {doc['commit_index']}  applied {doc['last_applied']}  members {len(doc['members'])}"]
    lines += job_lines(doc)
    group, train = doc.get("group"), doc.get("train")
    if group:
        lines.append(f"group generation {group['generation']}  rank {group['rank']}/{group['world_size']}")
    if train:
        lines.append(f"digest at step {train['step']}  samples {train['samples']}  loss {train['loss']}  "
                     f"params {str(train['params_digest'])[:16]}")
    crossed = _crossed(doc.get("cross_site_bytes"))
    if any(sent or received for sent, received in crossed.values()):
        lines.append("across sites: " + "  ".join(f"{p} sent {_size(sent)} received {_size(received)}"
                                                  for p, (sent, received) in sorted(crossed.items())))
    if doc.get("control") == "paused":
        lines.append("training is paused (an operator's `dpeer job pause`); `dpeer job resume` trains on")
    no_leader = doc.get("no_leader")
    if no_leader:
        lines.append(f"no leader for {no_leader['since_s']:.0f}s: {no_leader['reason']}")
        if no_leader["action"]:
            lines.append(f"what to do: {no_leader['action']}")
    return lines + [""] + members_table(member_rows(doc))
