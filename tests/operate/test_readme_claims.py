"""README.md and docs/*.md held to the code: every `dpeer ...` command they show parses (its
subcommands and flags exist, a flag's stated choices are its choices), every flag they name exists
where it belongs, every default, bound and exit code they state is the code's, and every relative
link, anchor and quoted section reference ("operations.md "Metrics"") resolves.

A claim this file checks by pattern fails when its sentence is reworded: then update the pattern
with the new wording (the check is the point, not the sentence).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from dpeer.cli import main as cli_main
from dpeer.cli.parser import DEFAULT_ADDR, build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
# Files whose prose may point at a section of a page ('README "Security"', 'operations.md "Logs"').
SOURCES = [*DOCS, *sorted((REPO / "dpeer").rglob("*.py")),
           *sorted(p for p in (REPO / "scripts").iterdir() if p.is_file()), *sorted((REPO / "deploy").rglob("*.yml")),
           *sorted(p for p in (REPO / "tests").rglob("*.py") if p != Path(__file__).resolve())]

# Flags of other tools that the docs show beside dpeer's (podman, docker, etcd, pip, torchrun ...):
# a flag of none of these, nor of dpeer or its scripts, is a mistake.
FOREIGN_TOOLS = ("podman", "docker", "buildah", "pip", "python3 -m pip", "torchrun", "nft", "rsync", "systemctl",
                 "promtool", "tc", "git", "curl", "mmdebstrap", "journalctl", "ip")
FOREIGN_FLAGS = {"--force-new-cluster", "--init", "--stop-timeout", "--network", "--gpus", "--device", "--restart",
                 "--format", "--isolation"}
# Words after `dpeer` that are deliberately not commands (a typo the docs quote, a container's name).
NOT_COMMANDS = {"stauts"}


# -- reading the pages -------------------------------------------------------------------------

def _fences(text: str) -> tuple[str, list[str]]:
    """The text without its fenced code blocks, and the blocks' lines."""
    prose, code, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            prose.append("")
            continue
        (code if inside else prose).append(line)
    return "\n".join(prose), code


def snippets(path: Path) -> list[str]:
    """Every piece of shell a page shows: its code spans (joined across line breaks) and the lines of
    its code blocks (without `# comments`)."""
    prose, code = _fences(path.read_text())
    spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]
    lines: list[str] = []
    for line in (re.sub(r"(^|\s)#\s.*$", "", line) for line in code):
        if lines and (lines[-1].endswith("\\") or re.match(r"\s+\[?--", line)):
            lines[-1] = lines[-1].rstrip("\\") + " " + line.strip()  # a continued command or synopsis
        else:
            lines.append(line)
    return [s for s in spans + lines if s.strip()]


def segments(snippet: str) -> list[list[str]]:
    """A snippet cut at shell separators into token lists."""
    cut = re.sub(r"<\(|\$\(|[()<>;]|&&|\s\|\s", "\n", snippet)  # a|b without spaces is a synopsis's choice
    return [part.split() for part in cut.splitlines() if part.split()]


def headings(path: Path) -> list[str]:
    prose, _ = _fences(path.read_text())
    return [m.group(2).strip() for m in re.finditer(r"^(#{1,6})\s+(.+)$", prose, re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


# -- the parser ---------------------------------------------------------------------------------

def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return list(parser._option_string_actions)


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for sub in subcommands(parser).values():
        yield from every_parser(sub)


PARSER = build_parser()
ALL_FLAGS = {f for p in every_parser(PARSER) for f in p._option_string_actions if f.startswith("--")}


def _clean(token: str) -> str:
    return token.strip("[]{}\"'").rstrip(",.:;")


@dataclass
class Mention:
    path: Path
    words: list[str]  # the command: "dpeer", subcommands
    flags: list[tuple[str, str | None]]  # each flag with the token after it


@dataclass
class Loose:
    """A flag a page shows outside a `dpeer ...` command, in the shell it stands in."""

    segment: str
    flag: str
    after: str | None


def dpeer_mentions(path: Path) -> tuple[list[Mention], list[Loose]]:
    """Every `dpeer SUBCOMMAND ... --flag` a page shows, and every flag it shows outside one."""
    mentions: list[Mention] = []
    loose: list[Loose] = []
    for snippet in snippets(path):
        for tokens in segments(snippet):
            used: set[int] = set()
            for i, tok in enumerate(tokens):
                if not re.fullmatch(r"(\S*/bin/)?dpeer", tok) or i + 1 == len(tokens):
                    continue
                if i > 0 and tokens[i - 1] in ("--name", "exec"):
                    continue  # a container named dpeer
                parser, j, words = PARSER, i + 1, ["dpeer"]
                while j < len(tokens) and _clean(tokens[j]) in subcommands(parser):
                    words.append(_clean(tokens[j]))
                    parser = subcommands(parser)[_clean(tokens[j])]
                    j += 1
                if len(words) == 1 and not tokens[j].startswith("--"):
                    word = _clean(tokens[j])
                    if word in NOT_COMMANDS or word == "dpeer" or not re.fullmatch(r"[a-z][a-z-]*", word):
                        continue
                    mentions.append(Mention(path, [*words, word], []))  # an unknown command: reported below
                    continue
                m = Mention(path, words, [])
                while j < len(tokens) and tokens[j] != "--" and not re.fullmatch(r"(\S*/bin/)?dpeer", tokens[j]):
                    tok = _clean(tokens[j])
                    if tok.startswith("--"):
                        after = _clean(tokens[j + 1]) if j + 1 < len(tokens) else None
                        m.flags.append((tok.split("=", 1)[0], after))
                    used.add(j)
                    j += 1
                mentions.append(m)
            for j, tok in enumerate(tokens):
                flag = _clean(tok).split("=", 1)[0]
                if j not in used and re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
                    after = _clean(tokens[j + 1]) if j + 1 < len(tokens) else None
                    loose.append(Loose(" ".join(tokens), flag, after))
    return mentions, loose



def _parser_of(words: list[str]) -> argparse.ArgumentParser | None:
    parser = PARSER
    for w in words[1:]:
        subs = subcommands(parser)
        if w not in subs:
            return None
        parser = subs[w]
    return parser


def test_every_dpeer_command_the_docs_show_parses() -> None:
    problems, checked = [], 0
    for path in DOCS:
        mentions, _ = dpeer_mentions(path)
        for m in mentions:
            where = f"{path.relative_to(REPO)}: `{' '.join(m.words)}`"
            parser = _parser_of(m.words)
            if parser is None:
                problems.append(f"{where}: no such command")
                continue
            for flag, after in m.flags:
                checked += 1
                action = option(parser, flag) or (option(PARSER, flag) if len(m.words) == 1 else None)
                if action is None:
                    known = sorted(o for o in option_strings(parser) if o.startswith("--"))
                    problems.append(f"{where} {flag}: no such flag (it has {known})")
                    continue
                if action.choices is not None and after and not after.startswith("-") and not after.isupper():
                    stated = [c for c in after.split("|") if c]
                    wrong = [c for c in stated if c not in action.choices]
                    if wrong:
                        problems.append(f"{where} {flag} {after}: {wrong} not among its choices {list(action.choices)}")
    assert not problems, "\n".join(problems)
    assert checked > 100, f"only {checked} flags found in dpeer commands: is the extraction still working?"


def _script_flags() -> dict[str, str]:
    """scripts/NAME -> its text, where its flags are spelled."""
    return {f"scripts/{p.name}": p.read_text() for p in (REPO / "scripts").iterdir() if p.is_file()}


def test_every_other_flag_the_docs_name_exists() -> None:
    """A flag outside a `dpeer ...` command: a dpeer flag (named in prose), a flag of the script the
    snippet runs (scripts/install.sh, scripts/bundle, ...), or another tool's."""
    scripts = _script_flags()
    every_script_flag = set(re.findall(r"--[a-z][a-z0-9-]*", "\n".join(scripts.values())))
    problems = []
    for path in DOCS:
        _, loose = dpeer_mentions(path)
        for item in loose:
            segment, flag = item.segment, item.flag
            named = [s for s in scripts if s in segment]
            if named:
                texts = [scripts[s] for s in named]
                if "scripts/chaos.py" in named:
                    texts.append(" ".join(option_strings(subcommands(PARSER)["chaos"])))
                if not any(flag in t for t in texts):
                    problems.append(f"{path.relative_to(REPO)}: `{segment}`: {named} has no {flag}")
                continue
            if any(segment.startswith(tool + " ") or f" {tool} " in f" {segment} " for tool in FOREIGN_TOOLS):
                continue
            if flag not in ALL_FLAGS | every_script_flag | FOREIGN_FLAGS:
                problems.append(f"{path.relative_to(REPO)}: `{segment}`: {flag} is no flag of dpeer or its scripts")
            choices = {c for p in every_parser(PARSER) if (a := option(p, flag)) is not None and a.choices
                       for c in a.choices}
            if choices and item.after and re.fullmatch(r"[a-z]+(\|[a-z]+)*", item.after):
                wrong = [c for c in item.after.split("|") if c not in choices]
                if wrong:
                    problems.append(f"{path.relative_to(REPO)}: `{segment}`: {wrong} are not choices of {flag} "
                                    f"({sorted(choices)})")
    assert not problems, "\n".join(problems)


def test_a_renamed_flag_is_caught() -> None:
    """The check above fails when a flag the README shows is renamed in the parser."""
    start = subcommands(PARSER)["start"]
    action = start._option_string_actions.pop("--metrics-listen")
    try:
        start._option_string_actions["--metrics-addr"] = action
        with pytest.raises(AssertionError, match="--metrics-listen: no such flag"):
            test_every_dpeer_command_the_docs_show_parses()
    finally:
        del start._option_string_actions["--metrics-addr"]
        start._option_string_actions["--metrics-listen"] = action


# -- defaults, bounds and figures the pages state -------------------------------------------------

def _claims() -> list[tuple[str, str, Callable[[], tuple[str, ...]]]]:
    """(page, pattern whose groups state values, the code's values as the page writes them)."""
    from dpeer.chaos.options import KINDS, ChaosOptions
    from dpeer.consensus.config import PRESETS
    from dpeer.consensus.force import force_after, reach_window
    from dpeer.consensus.identity import answer_window
    from dpeer.daemon.decide import failures, probe_rtt, sites
    from dpeer.daemon.serve import service
    from dpeer.daemon.worker import supervisor
    from dpeer.daemon.config import NodeConfig, TrainingConfig
    from dpeer.daemon.timing import LEADER_PRESETS
    from dpeer.security import auth, proof
    from dpeer.statemachine.entry import MAX_VALUE
    from dpeer.trainer import fixedpoint, rendezvous_server, rendezvous_table, rendezvous_wire

    node, training, lan = NodeConfig(), TrainingConfig(), PRESETS["lan"]

    def g(x: float) -> str:
        return f"{x:g}"

    def n(x: int) -> str:
        return f"{x:,}"

    return [
        ("README.md", r"else `\$DPEER_ADDR`, else the `--config`'s address, else `([^`]+)`", lambda: (DEFAULT_ADDR,)),
        ("README.md", r"`--preset (\S+)` sets the timing of failure detection and elections \(`(\w+)` by default\)",
         lambda: ("|".join(LEADER_PRESETS), node.preset)),
        ("docs/operations.md", r"`--config`'s advertised address, else `([^`]+)`", lambda: (DEFAULT_ADDR,)),
        ("docs/operations.md", r"`listen` defaults to\s+`([^`]+)` and `data_dir` to `([^`]+)`",
         lambda: (node.listen, str(node.data_dir))),
        ("docs/operations.md", r"Presets `(\w+)` \(the\s+default\), `(\w+)` and `(\w+)`",
         lambda: (node.preset, *[p for p in LEADER_PRESETS if p != node.preset])),
        ("docs/operations.md", r"exactly \(up to (\d+) characters\)", lambda: (str(MAX_VALUE),)),
        ("docs/operations.md", r"the smallest of its last (\d+) probe round\s+trips is under (\S+) ms, and turns \*far\* "
         r"again only once that smallest is over (\S+) ms",
         lambda: (str(probe_rtt.RECENT), g(sites.NEAR_MS), g(sites.FAR_MS))),
        ("docs/operations.md", r"at most (\d+) of them, the smallest ids", lambda: (str(sites.MAX_NEAR),)),
        ("CHANGELOG.md", r"the smallest of a link's last (\d+) round trips under\s+(\S+) ms links two boxes, over (\S+) ms",
         lambda: (str(probe_rtt.RECENT), g(sites.NEAR_MS), g(sites.FAR_MS))),
        ("docs/recovery.md", r"quiet window \((\S+) s on `lan`\)", lambda: (g(LEADER_PRESETS["lan"].quiet_window),)),
        ("docs/recovery.md", r"backing off \((\S+) s doubling to (\S+) s on `lan`\)",
         lambda: (g(LEADER_PRESETS["lan"].failure_grace), g(failures.BACKOFF_CAP))),
        ("docs/recovery.md", r"`lan`: every (\S+) s, learners every\s+(\S+) s, instead of every (\S+) ms and (\S+) s\)",
         lambda: (g(lan.idle_heartbeat_interval), g(lan.idle_learner_heartbeat_interval),
                  g(lan.heartbeat_interval * 1000), g(lan.learner_heartbeat_interval))),
        ("docs/recovery.md", r"replaced after\s+(\d+)-(\d+) s\.",
         lambda: (g(lan.idle_election_timeout), g(lan.idle_election_timeout * 1.5))),
        ("docs/recovery.md", r"retried across a leader change for up to (\S+) s", lambda: (g(service.COMMAND_TIMEOUT),)),
        ("docs/recovery.md", r"`training.stopped_after` seconds \((\S+)\) or silent for `training.hang_after` seconds \((\S+)\)",
         lambda: (g(training.stopped_after), g(training.hang_after))),
        ("docs/recovery.md", r"back off\s+\(([\d., ]+), then (\S+) s",
         lambda: (", ".join(g(x) for x in supervisor.RESTART_BACKOFF[1:-1]), g(supervisor.RESTART_BACKOFF[-1]))),
        ("docs/recovery.md", r"every `training.digest_every` steps, (\d+),", lambda: (str(training.digest_every),)),
        ("docs/recovery.md", r"`training.failure_repeats` generations\s+in a row \((\d+)\)",
         lambda: (str(training.failure_repeats),)),
        ("docs/recovery.md", r"\((\S+) s for a voter on `lan`, (\S+) s for a learner\)",
         lambda: (g(answer_window(lan)), g(2 * max(lan.idle_learner_heartbeat_interval, lan.election_timeout_max)))),
        ("docs/recovery.md", r"at most (\d+) by\s+default, `max_voters`", lambda: (str(node.max_voters),)),
        ("docs/recovery.md", r"(\d+) s on `lan`, (\d+) s on `wan`, (\d+) s on `edge`\)",
         lambda: tuple(g(force_after(PRESETS[p])) for p in ("lan", "wan", "edge"))),
        ("docs/recovery.md", r"arrived within (\d) x the\s+busy election timeout",
         lambda: (g(reach_window(lan) / lan.election_timeout_max),)),
        ("docs/security.md", r"timestamp is within (\d+) s of its clock", lambda: (g(proof.FRESH_S),)),
        ("docs/security.md", r"holds at most ([\d,]+) fresh nonces for each signer", lambda: (n(proof.MAX_PER_SIGNER),)),
        ("docs/security.md", r"\((\d+) connections that proved no key, frames of (\d+) KiB, ([\d,]+) keys and (\d+) MiB a\s+"
         r"generation; a connection that proves no key is closed after (\d+) s",
         lambda: (str(rendezvous_server.MAX_UNPROVEN), str(rendezvous_wire.MAX_FRAME >> 10),
                  n(rendezvous_table.LIMITS.max_keys), str(rendezvous_table.LIMITS.max_bytes >> 20),
                  g(rendezvous_server.UNPROVEN_IDLE_S))),
        ("docs/security.md", r"reason every (\d+) s at most", lambda: (g(auth.RefusalLog().interval),)),
        ("docs/exactness.md", r"At most ([\d,]+) micro-batches per step", lambda: (n(fixedpoint.MAX_MICRO_BATCHES),)),
        ("docs/exactness.md", r"at least 2\*\*\(E - (\d+)\) \((\d+) micro-batches per step",
         lambda: (str(fixedpoint.fraction_bits(4) - 24), "4")),
        ("docs/exactness.md", r"its ([\d,]+)-element bucket: (\d+) times the bucket's largest",
         lambda: (n(fixedpoint.BUCKET), str(2 ** fixedpoint.HEADROOM))),
        ("docs/exactness.md", r"E stays within (\d+) bits", lambda: (str(fixedpoint.FLOOR_GAP),)),
        ("docs/exactness.md", r"multiple of 2\*\*\(E - (\d+)\)", lambda: (str(fixedpoint.fraction_bits(4)),)),
        ("docs/chaos.md", r"`--kv-clients` clients \((\d+)\)", lambda: (str(ChaosOptions().kv_clients),)),
        ("docs/chaos.md", r"limits the fault kinds \(([a-z, ]+)\)", lambda: (", ".join(KINDS),)),
        ("docs/install.md", r"`--nodes N`, (\d+);", lambda: (str(subcommands(PARSER)["demo"].get_default("nodes")),)),
    ]


CLAIMS = _claims()


@pytest.mark.parametrize("page,pattern,expected", CLAIMS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CLAIMS)])
def test_a_stated_default_is_the_codes(page: str, pattern: str, expected: Callable[[], tuple[str, ...]]) -> None:
    text = " ".join((REPO / page).read_text().split())
    found = re.search(pattern, text)
    assert found, f"{page} no longer states this (reworded? update the pattern): {pattern}"
    assert found.groups() == expected(), f"{page}: {found.group(0)!r} states {found.groups()}, the code {expected()}"


def test_the_timing_table_is_the_presets() -> None:
    """operations.md "Timing presets": each row's lan / wan / edge values are the presets'."""
    from dpeer.daemon.timing import preset_values

    text = (REPO / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| ((?:membership|raft|leader)\.[^|(]+?)\s*(?:\([^|]*\))?\s*\| ([^|]+) \| ([^|]+) \| ([^|]+) \|$",
                      text, re.M)
    assert len(rows) >= 9, rows
    for keys, *values in rows:
        section, first = keys.split(".", 1)
        if " - " in first:  # raft.election_timeout_min - max | 0.3-0.6 s
            base = first.split(" - ")[0].rsplit("_", 1)[0]
            names, split = [f"{base}_min", f"{base}_max"], "-"
        else:
            names, split = [k.strip() for k in first.split(" / ")], " / "
        for preset, cell in zip(("lan", "wan", "edge"), values):
            stated = [float(v) for v in cell.replace(" s", "").split(split)]
            actual = [float(preset_values(preset)[section][k]) for k in names]
            assert stated == actual, f"operations.md timing table, {keys} on {preset}: states {stated}, the preset {actual}"


# -- exit codes ---------------------------------------------------------------------------------

CODE_WORDS = {cli_main.EXIT_OK: "success", cli_main.EXIT_NO: "negative", cli_main.EXIT_USAGE: "usage",
              cli_main.EXIT_UNREACHABLE: "unreachable|did not answer", cli_main.EXIT_RUNTIME: "runtime"}


@pytest.mark.parametrize("page", ["README.md", "docs/operations.md", "docs/architecture.md"])
def test_the_stated_exit_codes_are_the_codes(page: str) -> None:
    text = " ".join((REPO / page).read_text().split())
    sentence = re.search(r"Exit codes: (.+?)(?:\.(?: |$))", text)
    assert sentence, f"{page} no longer lists the exit codes"
    parts = re.split(r"(?:^|, )(\d) (?=\D)", sentence.group(1))[1:]
    stated = dict(zip(parts[::2], parts[1::2]))
    assert sorted(int(k) for k in stated) == sorted(CODE_WORDS), f"{page} lists exit codes {sorted(stated)}"
    for code, words in CODE_WORDS.items():
        assert re.search(words, stated[str(code)]), f"{page}: exit {code} is {stated[str(code)]!r}, the code's is {words}"


def test_the_unit_does_not_restart_on_the_usage_code() -> None:
    """README: 4 'which the unit restarts on'; operations.md: it restarts on everything but 2."""
    unit = (REPO / "scripts" / "dpeer.service").read_text()
    assert f"RestartPreventExitStatus={cli_main.EXIT_USAGE}" in unit and "Restart=on-failure" in unit


def test_every_exit_code_the_docs_quote_exists() -> None:
    allowed = set(CODE_WORDS)
    for path in DOCS:
        text = " ".join(path.read_text().split())
        for code in re.findall(r"\bexits? (\d+)\b", text):
            assert int(code) in allowed, f"{path.relative_to(REPO)} quotes exit {code}, not one of {sorted(allowed)}"


@pytest.mark.parametrize("argv,code", [
    (["log", "--addr", "127.0.0.1:1", "--from", "5", "--to", "2"], cli_main.EXIT_USAGE),  # "2 on a bad range"
    (["force", "--addr", "127.0.0.1:1", "--voters", "n1"], cli_main.EXIT_USAGE),  # "Without `--yes` it exits 2"
    (["stauts"], cli_main.EXIT_USAGE),  # operations.md: "did you mean 'status'?"
    (["status", "--addr", "127.0.0.1:1", "--timeout", "2"], cli_main.EXIT_UNREACHABLE),
])
def test_the_documented_exit_of_a_command(argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(argv) == code
    if argv == ["stauts"]:
        assert "did you mean 'status'?" in capsys.readouterr().err


# -- links ----------------------------------------------------------------------------------------

def test_every_relative_link_resolves() -> None:
    problems, checked = [], 0
    for path in DOCS:
        prose, _ = _fences(path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{path.relative_to(REPO)}: ({target}): no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                problems.append(f"{path.relative_to(REPO)}: ({target}): no heading #{anchor} in {dest.name}")
    assert not problems, "\n".join(problems)
    assert checked > 30, checked


def _page(name: str, source: Path) -> Path | None:
    name = {"README": "README.md", "BENCHMARKS": "BENCHMARKS.md"}.get(name, name)
    for base in (source.parent, REPO, REPO / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def test_every_quoted_section_exists() -> None:
    """'docs/operations.md "Containers"', 'README "Security"', 'jobs.md, "Upgrade"' in the pages, the
    code's comments, the scripts and the alert rules name a heading of that page (or its start)."""
    problems, checked = [], 0
    for source in SOURCES:
        text = " ".join(source.read_text(errors="replace").split())
        for name, section in re.findall(r"((?:[\w-]+/)*[\w-]+\.md|\bREADME\b|\bBENCHMARKS\b),? \\?\"([^\"\\]+)\\?\"",
                                        text):
            page = _page(name, source)
            if page is None:
                problems.append(f"{source.relative_to(REPO)}: {name} \"{section}\": no such page")
                continue
            checked += 1
            titles = [h.replace("`", "") for h in headings(page)]
            if not any(t == section or t.startswith(section) for t in titles):
                problems.append(f"{source.relative_to(REPO)}: {name} \"{section}\": no such section in {page.name}")
    assert not problems, "\n".join(problems)
    assert checked > 10, checked


def test_every_repository_path_the_docs_name_exists() -> None:
    problems = []
    for path in [*DOCS, *SOURCES]:
        text = path.read_text(errors="replace")
        for doc in set(re.findall(r"(?<![\w/.])docs/[\w-]+\.md", text)):
            if not (REPO / doc).is_file():
                problems.append(f"{path.relative_to(REPO)}: {doc} does not exist")
    for path in DOCS:
        for snippet in snippets(path):
            for name in re.findall(r"(?<![\w./-])((?:dpeer|scripts|tests|deploy|proto)/[\w./-]*[\w])", snippet):
                if not (REPO / name).exists():
                    problems.append(f"{path.relative_to(REPO)}: `{snippet}` names {name}, which does not exist")
    assert not problems, "\n".join(sorted(set(problems)))


# -- the two commands CI runs ------------------------------------------------------------------------

def test_the_readme_shows_the_two_commands_ci_runs() -> None:
    """README's "Two commands" section shows `scripts/demo` and `scripts/test`, each alone in a code
    block, and .ci/run runs that test command."""
    text = README.read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert [b.strip() for b in blocks] == ["scripts/demo", "scripts/test"], blocks
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert shlex.split(ci[-1]) == ["exec", "scripts/test"], ci[-1]
    for script in ("scripts/demo", "scripts/test"):
        assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    assert len(text.splitlines()) <= 200, "README.md is the front door: keep it to about 200 lines, the rest in docs/"
