"""`dpeer kv` at its edges (issue 35, finding 7): `kv list` prints each pair as one unambiguous
line (control characters and backslashes escaped; --json exact), a value comes from stdin (`-`)
or a file (`--file`), bounded by what a node accepts, and keys starting with '-' go after '--'."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from dpeer.cli.kv_text import escape, read_value
from dpeer.statemachine.entry import MAX_VALUE
from tests.support.daemons import DPEER, Daemons, cli, cli_many, formed, one_sentence


def test_escape_makes_each_key_one_line_a_tab_can_split() -> None:
    assert escape("plain key: é ✓") == "plain key: é ✓"
    assert escape("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
    assert escape("\x1b[31mred\x00\x7f\x85") == "\\x1b[31mred\\x00\\x7f\\x85"
    assert escape("\u202eevil\u2028") == "\\u202eevil\\u2028"
    assert escape("\U000e0001") == "\\U000e0001"
    for text in ("a\tb", "a\\tb", "a\\\tb", "\n", "\\n"):  # different texts never print alike
        assert "\t" not in escape(text) and "\n" not in escape(text)
    assert len({escape(t) for t in ("a\tb", "a\\tb", "a\\\tb", "\n", "\\n")}) == 5


def test_read_value_is_exact_and_bounded() -> None:
    assert read_value(io.BytesIO("line one\nzwei ✓\n".encode()), "stdin", 100) == "line one\nzwei ✓\n"
    assert read_value(io.BytesIO(("✓" * 100).encode()), "stdin", 100) == "✓" * 100  # 300 bytes, 100 characters
    with pytest.raises(ValueError, match="stdin holds 101 characters; a value may have at most 100"):
        read_value(io.BytesIO(b"x" * 101), "stdin", 100)
    with pytest.raises(ValueError, match="--file big holds more than 100 characters"):
        read_value(io.BytesIO(b"x" * 10_000), "--file big", 100)
    with pytest.raises(ValueError, match="stdin is not UTF-8 text"):
        read_value(io.BytesIO(b"\xff\xfe"), "stdin", 100)


def put_stdin(addr: str, key: str, data: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([*DPEER, "kv", "put", "--addr", addr, "--", key, "-"], input=data, capture_output=True,
                          timeout=60)


def test_kv_values_from_stdin_and_files_keys_after_dashes_and_escaped_listing(daemons: Daemons,
                                                                            tmp_path: Path) -> None:
    n1 = daemons.start("n1")
    formed(n1.addr, {"n1"})
    card = tmp_path / "card.md"
    card.write_text("# model card\n\ttabbed line\n")
    too_big = tmp_path / "big.txt"
    too_big.write_text("x" * (MAX_VALUE + 1))
    puts = cli_many([
        ["kv", "put", "--addr", n1.addr, "--", "-dash", "-v"],
        ["kv", "put", "--addr", n1.addr, "card", "--file", str(card)],
        ["kv", "put", "--addr", n1.addr, "--", "tab\tkey", "back\\slash"],
    ])
    for result in puts:
        assert result.returncode == 0, (result.args, result.stderr)
    piped = put_stdin(n1.addr, "esc\x1bkey", b"line one\nline two\n")
    assert piped.returncode == 0, piped.stderr

    listed, as_json, got = cli_many([["kv", "list", "--addr", n1.addr], ["kv", "list", "--addr", n1.addr, "--json"],
                                     ["kv", "get", "--addr", n1.addr, "--json", "--", "-dash"]])
    expected = {"-dash": "-v", "card": "# model card\n\ttabbed line\n", "esc\x1bkey": "line one\nline two\n",
                "tab\tkey": "back\\slash"}
    assert json.loads(as_json.stdout) == expected, as_json.stdout
    assert listed.stdout.splitlines() == ["-dash\t-v", "card\t# model card\\n\\ttabbed line\\n",
                                          "esc\\x1bkey\tline one\\nline two\\n", "tab\\tkey\tback\\\\slash"]
    assert json.loads(got.stdout) == {"key": "-dash", "found": True, "value": "-v"}

    refused = cli_many([
        ["kv", "put", "--addr", n1.addr, "big", "--file", str(too_big)],
        ["kv", "put", "--addr", n1.addr, "gone", "--file", str(tmp_path / "missing")],
        ["kv", "put", "--addr", n1.addr, "both", "v", "--file", str(card)],
        ["kv", "put", "--addr", n1.addr, "neither"],
        ["kv", "put", "--addr", n1.addr, "-dash", "v"],
    ])
    big, gone, both, neither, dash = (one_sentence(r.stderr) for r in refused)
    assert all(r.returncode == 2 and r.stdout == "" for r in refused), refused
    assert f"--file {too_big} holds {MAX_VALUE + 1} characters; a value may have at most {MAX_VALUE}" in big
    assert f"--file {tmp_path / 'missing'} cannot be read: No such file or directory" in gone
    assert "not both" in both and "as - to read it from stdin" in neither
    assert "unrecognized arguments: -dash" in dash and "goes after '--'" in dash
    assert cli("kv", "get", "big", "--addr", n1.addr).returncode == 1, "nothing was written"


def test_a_non_utf8_argument_is_refused_with_a_sentence() -> None:
    """A key, value or prefix holding bytes that are not UTF-8 (0xff from a shell's $'\\xff'; Python
    keeps it as the lone surrogate U+DCFF) gets the sentence stdin and --file get, exit 2, before any
    node is dialled (review of issue 35: it was Python's codec error)."""
    cases = {("put", "k", "\udcff"): "VALUE is not UTF-8 text (byte 0xff at character 1)",
             ("put", "\udcff", "v"): "KEY is not UTF-8 text (byte 0xff at character 1)",
             ("get", "a\udcff"): "KEY is not UTF-8 text (byte 0xff at character 2)",
             ("delete", "\udcfe"): "KEY is not UTF-8 text (byte 0xfe at character 1)",
             ("list", "--prefix", "\udcff"): "--prefix is not UTF-8 text (byte 0xff at character 1)"}
    results = cli_many([["kv", *args, "--addr", "127.0.0.1:1", "--timeout", "2"] for args in cases])
    for (args, expected), done in zip(cases.items(), results):
        line = one_sentence(done.stderr)
        assert done.returncode == 2, (args, line)
        assert expected in line and "codec" not in line and "surrogates" not in line, (args, line)
        assert line.endswith("kv keys, values and prefixes are UTF-8 text: encode other bytes as text first "
                             "(base64, say)"), line
