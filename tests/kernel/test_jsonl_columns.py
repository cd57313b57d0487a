"""A corrupt line in the middle of a log: the message names that line and the column on it.

Each case damages line 6 of a real corpus log (46 lines) and compares the reported column with
what ``json.loads`` says about that line alone (``exc.colno``, ``StopIteration`` included), or,
where the line's value never ends, with the line's own end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kiso.kernel import CorruptLogError
from kiso.kernel.jsonl import parse_log

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "v1" / "scripted-3-runs.jsonl"
LINES = CORPUS.read_bytes().split(b"\n")
GOOD = LINES[5]  # line 6: a whole record with lines before and after it


def damaged(line: bytes, number: int = 6) -> CorruptLogError:
    lines = list(LINES)
    lines[number - 1] = line
    with pytest.raises(CorruptLogError) as caught:
        parse_log(b"\n".join(lines), "x.jsonl")
    assert caught.value.line == number, str(caught.value)
    return caught.value


def column(error: CorruptLogError) -> int:
    found = re.search(r"at column (\d+)\)|ends at column (\d+) inside", str(error))
    assert found, str(error)
    return int(found.group(1) or found.group(2))


def colno_by_json(line: bytes) -> int:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(line)
    return caught.value.colno


@pytest.mark.parametrize(
    "line",
    [
        GOOD[:30] + b"\x01" + GOOD[30:],  # a control character inside a string
        GOOD.replace(b'"type"', b'"type" x', 1),  # a stray token after a key
        GOOD.replace(b'"seq":5', b'"seq":5,,', 1),  # a doubled comma
        b'{"seq": 5, "ts": 1005, "x": tru}',  # no value where one must start, mid-line
        b'{"seq": 5, "x": "\\q"}',  # an invalid escape
        b"garbage",
        b'  {"seq": 5}',  # leading whitespace: no value at column 1
    ],
    ids=["control-char", "stray-token", "double-comma", "bad-literal", "bad-escape", "garbage",
         "indented"],
)  # fmt: skip
def test_the_column_is_the_one_json_gives_for_that_line_alone(line: bytes) -> None:
    error = damaged(line)
    if line.startswith(b" "):
        assert column(error) == 1  # the log is stricter than json.loads: no surrounding space
    else:
        assert column(error) == colno_by_json(line), str(error)
    assert "line 6" in str(error)


def test_extra_data_after_the_value_is_at_its_first_character() -> None:
    error = damaged(GOOD + b" junk")
    assert "extra data" in str(error) and column(error) == len(GOOD) + 1


@pytest.mark.parametrize(
    "line",
    [GOOD[:-1], GOOD[:40], GOOD[: GOOD.index(b":") + 1]],
    ids=["no-closing-brace", "cut-mid-string", "cut-after-a-key"],
)
def test_a_value_cut_off_in_the_middle_of_the_file_is_reported_on_its_own_line(line: bytes) -> None:
    # The scanner reads on into line 7 (newlines are whitespace to JSON); the report stays here.
    error = damaged(line)
    assert f"the line ends at column {len(line) + 1} inside its value" in str(error)


def test_a_record_split_across_two_lines_is_corrupt_at_the_first() -> None:
    head, tail = GOOD.split(b",", 1)
    error = damaged(head + b",\n" + tail)
    assert f"the line ends at column {len(head) + 2} inside its value" in str(error)


def test_the_header_line_is_measured_from_its_own_start() -> None:
    error = damaged(LINES[0].replace(b'"v":1', b'"v":1 x', 1), number=1)
    assert column(error) == colno_by_json(LINES[0].replace(b'"v":1', b'"v":1 x', 1))


def test_a_line_late_in_the_file_counts_its_column_from_its_own_start() -> None:
    line = LINES[44]
    assert line, "the corpus has 46 lines"
    bad = line[:10] + b"\x02" + line[10:]
    assert column(damaged(bad, number=45)) == 11
