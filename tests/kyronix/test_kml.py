"""KML, version 1: the scanner, the serializer and their properties."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kyronix.kml import BLOCK_ARGS, STATUSES, KmlError, Plan, ToolCall, parse, serialize, to_ast

SEED = """Sure, here is the plan:
```xml
<kyronix>
  <plan>
    I need to create the utility functions file as requested by the user.
  </plan>
  <tool name="write_file">
    <path>src/utils/math.ts</path>
    <content>
      export const add = (a: number, b: number) => a + b;
    </content>
  </tool>
  <summary>Created the math.ts utility file successfully.</summary>
  <status>complete</status>
</kyronix>
```
Let me know if you need anything else.
"""


def one_tool(body: str, attrs: str = 'name="write_file" executionId="t1"') -> ToolCall:
    plan = parse(f"<kyronix><tool {attrs}>{body}</tool></kyronix>")
    assert len(plan.tools) == 1
    return plan.tools[0]


def test_clean_plan_in_prose_and_fences() -> None:
    plan = parse(SEED)
    assert plan.plan == "I need to create the utility functions file as requested by the user."
    assert plan.summary == "Created the math.ts utility file successfully."
    assert plan.status == "complete"
    (tool,) = plan.tools
    assert tool.name == "write_file"
    assert tool.args == {
        "path": "src/utils/math.ts",
        "content": "      export const add = (a: number, b: number) => a + b;\n",
    }
    assert tool.assigned is True
    assert tool.execution_id.startswith("exec_") and len(tool.execution_id) == 37


def test_tools_in_document_order_and_args_ordered() -> None:
    plan = parse(
        "<kyronix><tool name='b' executionId='1'><z>1</z><a>2</a></tool>"
        "<tool name='a' executionId='2'/></kyronix>"
    )
    assert [t.name for t in plan.tools] == ["b", "a"]
    assert list(plan.tools[0].args) == ["z", "a"]
    assert plan.tools[1].args == {}
    assert plan.tools[0].assigned is False
    assert plan.tools[0].execution_id == "1"


def test_bare_tools_without_envelope() -> None:
    text = 'Do this:\n<tool name="read_file"><path> a.txt </path></tool>\nthen\n<tool name="x"/>'
    plan = parse(text)
    assert [(t.name, t.args) for t in plan.tools] == [("read_file", {"path": "a.txt"}), ("x", {})]
    assert plan.plan is None and plan.status is None


def test_no_kml_at_all_is_an_error() -> None:
    with pytest.raises(KmlError) as e:
        parse("just prose, <toolbox> is not a tool")
    assert e.value.expected == "<kyronix> or <tool>"


def test_unescaped_lt_and_amp_in_content() -> None:
    body = '<path>a.py</path><content>\nif a < b && c > 0:\n    x = "<div>" & y\n</content>'
    assert one_tool(body).args["content"] == 'if a < b && c > 0:\n    x = "<div>" & y\n'


def test_closing_tag_and_tool_literal_inside_content() -> None:
    inner = 'see </path> and <tool name="x"> and </content> here\n'
    body = f"<content>\n{inner}</content>\n<path>p</path>"
    tool = one_tool(body)
    assert tool.args == {"content": inner, "path": "p"}
    jsx = "<div>\n  <path d='M0'/>\n</div>\n"
    assert one_tool(f"<content>{jsx}</content>").args == {"content": jsx}


def test_cdata_verbatim_and_split_rejoined() -> None:
    tool = one_tool('<content><![CDATA[a < b && "&lt;" ]]></content>')
    assert tool.args["content"] == 'a < b && "&lt;" '
    tool = one_tool("<content><![CDATA[x ]]]]><![CDATA[> y]]></content>")
    assert tool.args["content"] == "x ]]> y"
    tool = one_tool("<content>\n  <![CDATA[\n keep \n]]>\n</content>")
    assert tool.args["content"] == "\n keep \n"
    tool = one_tool("<path> <![CDATA[</path>]]> </path>")
    assert tool.args["path"] == "</path>"
    # CDATA inside raw text is part of the text: kept verbatim, markers included
    tool = one_tool("<content>a <![CDATA[<b>]]> c\n  </content>")
    assert tool.args["content"] == "a <![CDATA[<b>]]> c\n"


SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg">\n'
    "  <script><![CDATA[\n    if (a < b && c) { go('</content>'); }\n  ]]></script>\n"
    "</svg>\n"
)


def test_cdata_inside_raw_text_is_kept_verbatim() -> None:
    """An SVG (or XHTML) file whose script is a CDATA section keeps its markers: they are part
    of the file, not of the plan. Its ``</content>`` inside the section ends nothing."""
    tool = one_tool(f"<path>icon.svg</path><content>\n{SVG}</content>")
    assert tool.args == {"path": "icon.svg", "content": SVG}
    # the same inside a scalar, a section, and with raw text only after the section
    assert one_tool("<path>a<![CDATA[b]]></path>").args["path"] == "a<![CDATA[b]]>"
    tail = one_tool("<content><![CDATA[x]]>tail</content>").args["content"]
    assert tail == "<![CDATA[x]]>tail"
    plan = parse("<kyronix><plan>see <![CDATA[<x>]]></plan></kyronix>")
    assert plan.plan == "see <![CDATA[<x>]]>"
    # and the serializer writes it back so that it reads the same
    again = parse(serialize(parse(f"<tool name='w'><content>{SVG}</content></tool>")))
    assert again.tools[0].args["content"] == SVG


def test_comments_between_tools_and_around_the_envelope_are_ignored() -> None:
    text = (
        "<!-- the plan follows -->\n<kyronix>\n  <!-- first, the file -->\n"
        "  <plan>p</plan> <!-- after the plan -->\n"
        '  <tool name="write_file" executionId="w">\n    <!-- where -->\n'
        "    <path>a.txt</path><!-- what --><content>x</content>\n  <!-- end --></tool>\n"
        "  <!-- between --><!-- two -->\n"
        '  <tool name="read_file" executionId="r"><path>a.txt</path></tool>\n'
        "  <status>complete</status>\n<!-- last --></kyronix>\n<!-- trailing -->"
    )
    plan = parse(text)
    assert [(t.name, t.args) for t in plan.tools] == [
        ("write_file", {"path": "a.txt", "content": "x"}),
        ("read_file", {"path": "a.txt"}),
    ]
    assert plan.plan == "p" and plan.status == "complete"
    # bare tools, with comments between them
    bare = parse("<!-- a --><tool name='a'/>\n<!-- b -->\n<tool name='b'></tool><!-- c -->")
    assert [t.name for t in bare.tools] == ["a", "b"]


def test_what_a_comment_holds_outside_the_envelope_is_not_kml() -> None:
    hidden = "<!-- an example: <kyronix><tool name='rm'><path>x</path></tool></kyronix> -->\n"
    assert [t.name for t in parse(hidden + "<kyronix><tool name='ok'/></kyronix>").tools] == ["ok"]
    assert [t.name for t in parse("<!-- <tool name='no'/> --><tool name='ok'/>").tools] == ["ok"]
    with pytest.raises(KmlError, match="no KML found"):
        parse("<!-- <tool name='no'/> -->")
    # An unclosed "<!--" in prose hides nothing (prose is not XML).
    assert [t.name for t in parse("use <!-- for comments <tool name='ok'/>").tools] == ["ok"]


def test_comments_in_raw_text_are_text_and_an_unclosed_one_is_an_error() -> None:
    html = "<p>a</p>\n<!-- <b>note</b> -->\n"
    assert one_tool(f"<content>{html}</content>").args["content"] == html
    # a comment right after a closing tag inside the content does not end the argument early
    tricky = "x</content><!-- y -->z"
    assert one_tool(f"<content>{tricky}</content>").args["content"] == tricky
    with pytest.raises(KmlError, match="truncated comment") as info:
        parse("<kyronix><!-- never closed <tool name='a'/></kyronix>")
    assert info.value.expected == "-->"
    with pytest.raises(KmlError, match="truncated comment"):
        parse("<kyronix><tool name='a'><!-- never closed <path>x</path></tool></kyronix>")


def test_truncated_plans_are_errors_with_offsets() -> None:
    full = '<kyronix><tool name="w"><path>a</path><content>x</content></tool></kyronix>'
    for cut in range(len("<kyronix>"), len(full)):
        with pytest.raises(KmlError) as e:
            parse(full[:cut])
        assert 0 <= e.value.offset <= cut
        assert e.value.expected
        assert f"at offset {e.value.offset}: expected {e.value.expected}" in str(e.value)
    with pytest.raises(KmlError) as e:
        parse(full[: full.index("</tool>")])
    assert e.value.expected == "</tool>"
    assert str(e.value).startswith(f"at offset {e.value.offset}: expected </tool>")
    with pytest.raises(KmlError) as e:
        parse(full[: full.index("</kyronix>")])
    assert (e.value.offset, e.value.expected) == (full.index("</kyronix>"), "</kyronix>")
    with pytest.raises(KmlError):
        parse("<kyronix><tool name='w'><content><![CDATA[abc</content></tool></kyronix>")


def test_duplicate_ids_missing_name_and_other_errors() -> None:
    dup = "<kyronix><tool name='a' executionId='x'/><tool name='b' executionId='x'/></kyronix>"
    with pytest.raises(KmlError) as e:
        parse(dup)
    assert e.value.expected == "a unique executionId"
    assert e.value.offset == dup.index("<tool name='b'")
    for bad in [
        "<kyronix><tool executionId='x'/></kyronix>",
        "<kyronix><tool name=''/></kyronix>",
        "<kyronix><tool name=a/></kyronix>",
        "<kyronix><tool name='a'><p>1</p><p>2</p></tool></kyronix>",
        "<kyronix><status>done</status></kyronix>",
        "<kyronix><plan>a</plan><plan>b</plan></kyronix>",
        "<kyronix>stray text</kyronix>",
        "<kyronix><tool name='a' name='b'/></kyronix>",
    ]:
        with pytest.raises(KmlError):
            parse(bad)
    with pytest.raises(KmlError) as e:
        parse("<kyronix><tool executionId='x'/></kyronix>")
    assert "name" in e.value.expected
    assert isinstance(e.value, ValueError)


def test_empty_execution_id_is_assigned() -> None:
    tool = one_tool("", attrs="name='a' executionId=''")
    assert tool.assigned is True and tool.execution_id


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\nline\n", "line\n"),
        ("\r\nline\r\n", "line\r\n"),
        ("\n\nline\n", "\nline\n"),
        ("\n    indented\n  ", "    indented\n"),
        ("\n  a\n\t \t", "  a\n"),
        ("no newline  ", "no newline  "),
        ("  lead\n  mid  \n", "  lead\n  mid  \n"),
        ("\n", ""),
        ("\n   ", ""),
        ("", ""),
        ("x\n  y", "x\n  y"),
    ],
)
def test_block_whitespace_rules(raw: str, expected: str) -> None:
    for name in sorted(BLOCK_ARGS):
        assert one_tool(f"<{name}>{raw}</{name}>").args[name] == expected


def test_scalar_arguments_are_stripped() -> None:
    assert one_tool("<path>\n   a b \t\n</path><line>  3 </line>").args == {
        "path": "a b",
        "line": "3",
    }


def test_crlf_content_preserved() -> None:
    content = "a\r\nb\r\n\r\nc\r\n"
    assert one_tool(f"<content>\r\n{content}</content>").args["content"] == content


def test_entities_decoded_in_attributes_only() -> None:
    tool = one_tool(
        "<content>&lt;b&gt; &amp;amp; &#65;</content><path>a&amp;b</path>",
        attrs="name=\"a&amp;b &quot;q&quot;\" executionId='&#x41;&lt;'",
    )
    assert tool.name == 'a&b "q"'
    assert tool.execution_id == "A<"
    assert tool.args == {"content": "&lt;b&gt; &amp;amp; &#65;", "path": "a&amp;b"}


def test_billion_laughs_and_xxe_stay_literal() -> None:
    bomb = (
        '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>\n'
        '<!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
    )
    text = bomb + "<kyronix><tool name='w'><content>&lol2; &xxe;</content></tool></kyronix>"
    assert parse(text).tools[0].args["content"] == "&lol2; &xxe;"
    inside = one_tool(f"<content>{bomb}</content>").args["content"]
    assert inside == bomb


def test_to_ast_shape() -> None:
    ast = to_ast(SEED)
    root = ast["root"]
    assert root["tag"] == "kyronix" and root["attributes"] == {}
    tags = [c["tag"] for c in root["children"] if not isinstance(c, str)]
    assert tags == ["plan", "tool", "summary", "status"]
    tool = root["children"][1]
    assert not isinstance(tool, str)
    assert tool["attributes"] == {"name": "write_file"}
    assert tool["children"][0] == {
        "tag": "path",
        "attributes": {},
        "children": ["src/utils/math.ts"],
    }
    bare = to_ast("<tool name='a' executionId='1'><p>x</p></tool>")["root"]
    assert bare["tag"] == "kyronix"
    assert bare["children"] == [
        {
            "tag": "tool",
            "attributes": {"name": "a", "executionId": "1"},
            "children": [{"tag": "p", "attributes": {}, "children": ["x"]}],
        }
    ]


def test_serialize_output_and_validation() -> None:
    plan = Plan(
        (ToolCall('w "x"', {"path": "a&b", "content": "x]]>y\n"}, "id<1>"),),
        "plan <with> lt",
        "done",
        "complete",
    )
    text = serialize(plan)
    assert text.startswith("<kyronix>\n") and text.endswith("</kyronix>\n")
    assert 'name="w &quot;x&quot;"' in text
    assert "<path>a&b</path>" in text
    assert "<content><![CDATA[x]]]]><![CDATA[>y\n]]></content>" in text
    assert parse(text) == plan
    for bad in [
        Plan((ToolCall("", {}, "1"),)),
        Plan((ToolCall("a", {}, ""),)),
        Plan((ToolCall("a", {}, "1"), ToolCall("b", {}, "1"))),
        Plan((ToolCall("a", {"no spaces": ""}, "1"),)),
        Plan(status="done"),
    ]:
        with pytest.raises(ValueError):  # noqa: PT011
            serialize(bad)


def test_assigned_is_not_part_of_equality() -> None:
    assert ToolCall("a", {}, "1", assigned=True) == ToolCall("a", {}, "1")
    parsed = parse(serialize(Plan((ToolCall("a", {}, "1", assigned=True),))))
    assert parsed.tools[0].assigned is False


# -- properties ---------------------------------------------------------------------------------

ARG_NAMES = ["path", "content", "command", "body", "cwd", "line", "url", "x.y", "_a-b"]
TRICKY = st.sampled_from(
    ["]]>", "</content>", "<content>", "</tool>", "<tool name='x'>", "<![CDATA[", "&lt;", "&",
     "\r\n", "\n", " ", "\t", "é", "😀", "</path>\n<path>", "</kyronix>", "<", "<!--", "-->"]
)  # fmt: skip
VALUES = st.lists(st.one_of(st.text(max_size=8), TRICKY), max_size=6).map("".join)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    n = draw(st.integers(0, 4))
    ids = draw(st.lists(st.text(min_size=1, max_size=6), min_size=n, max_size=n, unique=True))
    tools = []
    for i in range(n):
        names = draw(st.lists(st.sampled_from(ARG_NAMES), max_size=4, unique=True))
        args = {k: draw(VALUES) if k in BLOCK_ARGS else draw(VALUES).strip() for k in names}
        tools.append(ToolCall(draw(st.text(min_size=1, max_size=8)), args, ids[i]))
    section = st.none() | VALUES.map(str.strip)
    return Plan(
        tuple(tools),
        draw(section),
        draw(section),
        draw(st.none() | st.sampled_from(sorted(STATUSES))),
    )


@settings(max_examples=400, deadline=None)
@given(plans())
def test_round_trip(plan: Plan) -> None:
    assert parse(serialize(plan)) == plan


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(ARG_NAMES), max_size=3), VALUES)
def test_round_trip_unstripped_scalars(names: list[str], value: str) -> None:
    plan = Plan((ToolCall("t", dict.fromkeys(names, value), "1"),), value, value)
    assert parse(serialize(plan)) == plan


def _check(text: str) -> None:
    error: KmlError | None = None
    try:
        plan = parse(text)
    except KmlError as e:
        error = e
    if error is not None:
        assert 0 <= error.offset <= len(text)
        with pytest.raises(KmlError):
            to_ast(text)
        return
    assert isinstance(plan, Plan)
    assert len(to_ast(text)["root"]["children"]) >= len(plan.tools)


FRAGMENTS = st.sampled_from(
    ["<kyronix>", "</kyronix>", "<tool name='a'>", '<tool name="b" executionId="1">', "</tool>",
     "<tool", "<content>", "</content>", "<path>", "</path>", "<plan>", "</plan>", "<status>",
     "complete", "</status>", "<![CDATA[", "]]>", "<x/>", "'", '"', "=", " ", "\n", "&amp;", "<",
     ">", "/", "<!--", "-->", "<!-- c -->"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=40).map("".join))
def test_fuzz_fragments_only_kml_errors(text: str) -> None:
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_random_text_only_kml_errors(text: str) -> None:
    _check(text)


@settings(max_examples=300, deadline=None)
@given(plans(), st.data())
def test_fuzz_mutated_documents_only_kml_errors(plan: Plan, data: st.DataObject) -> None:
    text = serialize(plan)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 10)))
        text = text[:i] + data.draw(st.one_of(FRAGMENTS, st.text(max_size=3))) + text[j:]
    _check(text)


def _growth(make: Callable[[int], str], n: int, work: Callable[[str], object]) -> float:
    """How many times longer ``work`` takes on ``make(4 * n)`` than on ``make(n)``.

    No absolute bound (a busy machine is not a slow parser): the best of a few alternating
    timings of each size, the collector off while timing, each timing long enough to be read
    (both sizes repeated as often as the small one needs to take 20 ms). Linear work gives about
    4, quadratic about 16.
    """
    small, big = make(n), make(4 * n)
    began = time.perf_counter()
    work(small)
    number = max(1, math.ceil(0.02 / max(time.perf_counter() - began, 1e-9)))
    best = {small: math.inf, big: math.inf}
    enabled = gc.isenabled()
    try:
        for _ in range(3):
            for text in (small, big):
                gc.collect()
                gc.disable()
                began = time.perf_counter()
                for _ in range(number):
                    work(text)
                best[text] = min(best[text], time.perf_counter() - began)
                if enabled:
                    gc.enable()
    finally:
        if enabled:
            gc.enable()
    return best[big] / best[small]


LINEAR = 10.0
"""The most the 4x input may cost over the 1x one: well above linear (4), well below quadratic."""


@pytest.mark.parametrize(
    ("make", "n"),
    [
        (lambda k: "<kyronix><tool name='a'><content>" + "</content>x" * k, 25_000),
        (lambda k: "<kyronix><tool name='a'><content>" + "</content> \n" * k + "</tool>", 25_000),
        (lambda k: "<kyronix><tool name='a'><content>" + "<![CDATA[]]>" * k, 22_500),
        (lambda k: "<kyronix>" + "<tool name='a'><p>x</p></tool>" * k, 10_000),
        (lambda k: "<tool name='a'><p>x</p></tool>" * k, 10_000),
        (lambda k: "<kyronix><tool name='a'" + " b='1'" * k, 37_500),
        (lambda k: "<kyronix><tool name='a'><content>" + "</content><" * k, 25_000),
        (lambda k: "<kyronix><tool name='a'><content>" + "</content><!--" * k, 20_000),
        (lambda k: "<kyronix><tool name='a'><content>" + "</content><!--" * k + "-->", 20_000),
        (lambda k: "<kyronix><tool name='a'><content>" + "</content><!-- -->x" * k, 15_000),
        (lambda k: "<!--" * k + "<tool name='a'/>", 60_000),
        (lambda k: "<!-- -->" * k + "<tool name='a'/>", 30_000),
        (lambda k: "<!-- <tool " * k + "-->", 25_000),
        (lambda k: "<kyronix>" + "<!-- x -->" * k + "</kyronix>", 25_000),
        (lambda k: "<kyronix><tool name='a'>" + "<!-- x -->" * k + "</tool></kyronix>", 25_000),
    ],
    ids=[
        "close-then-text",
        "close-then-space",
        "empty-cdata",
        "many-tools",
        "many-tools-no-root",
        "many-attributes",
        "close-then-lt",
        "close-then-unclosed-comment",
        "close-then-comment-closed-at-the-end",
        "close-then-comment-then-text",
        "unclosed-comments-before-a-tool",
        "comments-before-a-tool",
        "tools-inside-one-comment",
        "comments-in-the-envelope",
        "comments-in-a-tool",
    ],
)
def test_linear_time_on_adversarial_megabyte(make: Callable[[int], str], n: int) -> None:
    assert len(make(4 * n)) > 900_000
    growth = _growth(make, n, _check)
    assert growth < LINEAR, f"4x the input took {growth:.1f}x the time: not linear"


def test_many_args_are_linear() -> None:
    def body(k: int) -> str:
        return "".join(f"<a{i}>v</a{i}>" for i in range(k))

    assert len(one_tool(body(50_000)).args) == 50_000
    growth = _growth(body, 12_500, one_tool)
    assert growth < LINEAR, f"4x the arguments took {growth:.1f}x the time: not linear"
