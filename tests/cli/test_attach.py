"""Attachments: ``@path`` brings a file's text, a path to an image brings the image.

Real files on disk (images by their real first bytes, a text file named .png, a 6 MB image,
files past the text cap, names with spaces, links, a FIFO), and end to end: the image block
reaches the openai-compat and anthropic adapters' local servers, base64 in the request body.
"""

from __future__ import annotations

import base64
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from kiso.cli.attach import (
    IMAGE_CAP,
    TEXT_CAP_LINES,
    AttachmentError,
    expand,
    expand_prompt,
    image_type,
)
from kiso.kernel import ImageBlock, MemorySessionStore, TextBlock, UsageError, User
from kiso.providers.anthropic import AnthropicAdapter
from kiso.providers.openai_compat import OpenAICompatAdapter
from kiso.providers.registry import supports_images
from kiso.runtime import Agent

from ..providers.anthropic_server import text_block, turn
from ..providers.sse import Event, SSEServer, Stream
from ..providers.test_openai_compat import text_reply


def png() -> bytes:
    """A real 1x1 PNG."""

    def part(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + part(b"IHDR", header) + part(b"IDAT", pixels) + part(b"IEND", b"")


GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"
WEBP = (  # a 1x1 lossless WebP
    b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00"
    b"\x2f\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00"
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "shot.png").write_bytes(png())
    return work


def blocks(prompt: str | list[Any]) -> list[Any]:
    assert isinstance(prompt, list), prompt
    return prompt


def images(prompt: str | list[Any]) -> list[ImageBlock]:
    return [b for b in blocks(prompt) if isinstance(b, ImageBlock)]


# --------------------------------------------------------------------------- images


@pytest.mark.parametrize(
    ("data", "media"),
    [(png(), "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (WEBP, "image/webp")],
)
def test_each_image_format_is_recognised_by_its_content_whatever_its_name(
    ws: Path, data: bytes, media: str
) -> None:
    (ws / "picture.dat").write_bytes(data)  # no image extension at all
    prompt = expand_prompt("what is in picture.dat?", ws)
    (image,) = images(prompt)
    assert image.media_type == media and base64.b64decode(image.data or "") == data
    assert image_type(data[:12]) == media


def test_the_image_goes_where_its_path_was_and_the_words_stay(ws: Path) -> None:
    prompt = blocks(expand_prompt("look at shot.png and fix the layout", ws))
    assert [type(b) for b in prompt] == [TextBlock, ImageBlock, TextBlock]
    assert prompt[0] == TextBlock("look at shot.png")
    assert prompt[2] == TextBlock(" and fix the layout")


def test_a_text_file_named_png_is_sent_as_text_with_a_note(ws: Path) -> None:
    (ws / "fake.png").write_text("I am not a picture\n")
    out = expand("look at fake.png", ws)
    assert out.prompt == "look at fake.png"  # the prompt itself, untouched
    assert out.notes == (
        "fake.png is not a PNG, JPEG, GIF or WebP image by its content; sent as text",
    )


def test_an_image_over_5_mb_is_a_clear_error(ws: Path) -> None:
    big = ws / "huge.png"
    big.write_bytes(png() + b"\x00" * (6 * 1024 * 1024))
    assert big.stat().st_size > IMAGE_CAP
    with pytest.raises(AttachmentError) as caught:
        expand_prompt("look at huge.png", ws)
    assert "huge.png is a 6.0 MB image; images are sent up to 5.0 MB" in str(caught.value)
    assert isinstance(caught.value, UsageError)


def test_a_model_without_image_input_is_named_in_the_error(ws: Path) -> None:
    assert not supports_images("deepseek-chat")
    with pytest.raises(AttachmentError, match="deepseek-chat takes no image input"):
        expand_prompt("look at shot.png", ws, vision=supports_images("deepseek-chat"),
                      model="deepseek-chat")  # fmt: skip
    # the way to mention an image to such a model: backticks
    assert expand_prompt("rename `shot.png` to logo.txt", ws, vision=False) == (
        "rename `shot.png` to logo.txt"
    )


def test_which_models_take_images() -> None:
    assert supports_images("gpt-4o-2024-08-06") and supports_images("claude-sonnet-4-5")
    assert not supports_images("deepseek-reasoner")
    assert supports_images("qwen2.5-vl-7b")  # unknown: sent, the server decides


def test_dragged_in_paths_absolute_escaped_quoted_or_a_file_url(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "Screen Shot 2026-01-01 at 10.00.00.png"
    outside.write_bytes(GIF)
    escaped = str(outside).replace(" ", "\\ ")
    for typed in (
        escaped,
        f"'{outside}'",
        f'"{outside}"',
        f"file://{str(outside).replace(' ', '%20')}",
    ):
        prompt = expand_prompt(f"what is this {typed} ", ws)
        (image,) = images(prompt)
        assert base64.b64decode(image.data or "") == GIF, typed
        assert blocks(prompt)[0] == TextBlock(f"what is this {typed}")


def test_trailing_punctuation_and_brackets_around_a_path(ws: Path) -> None:
    for text in ("see shot.png.", "see (shot.png)", "see shot.png, then fix it", "see shot.png?"):
        assert len(images(expand_prompt(text, ws))) == 1, text


def test_words_that_are_not_files_and_code_in_backticks_attach_nothing(ws: Path) -> None:
    for text in (
        "fix the bug",
        "email ana@shot.png",  # @ inside a word
        "see https://example.com/shot.png",
        "```\nshot.png\n```",
        "`shot.png`",
        "missing.png is gone",
    ):
        assert expand_prompt(text, ws) == text, text


def test_the_same_image_twice_is_sent_once(ws: Path) -> None:
    assert len(images(expand_prompt("shot.png vs ./shot.png", ws))) == 1


def test_an_image_through_a_link_names_the_target(ws: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere" / "real.png"
    real.parent.mkdir()
    real.write_bytes(png())
    (ws / "link.png").symlink_to(real)
    out = expand("look at link.png", ws)
    assert len(images(out.prompt)) == 1
    assert out.notes == (f"attached link.png (PNG image, {len(png())} bytes) (a link to {real})",)


# --------------------------------------------------------------------------- @path


def test_at_path_attaches_the_file_after_the_prompt(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "x.py").write_text("def f():\n    return 1\n")
    out = expand("why does @src/x.py return 1?", ws)
    assert out.prompt == [
        TextBlock("why does @src/x.py return 1?"),
        TextBlock('<file path="src/x.py">\ndef f():\n    return 1\n</file>'),
    ]
    assert out.notes == ("attached src/x.py",)


def test_at_path_with_spaces_quoted_or_escaped(ws: Path) -> None:
    (ws / "my notes.txt").write_text("remember the milk")
    for typed in ('@"my notes.txt"', "@'my notes.txt'", "@my\\ notes.txt"):
        files = blocks(expand_prompt(f"summarise {typed}", ws))[1:]
        assert files == [TextBlock('<file path="my notes.txt">\nremember the milk\n</file>')], typed


def test_a_big_text_file_is_cut_at_the_line_cap_and_says_so(ws: Path) -> None:
    lines = [f"line {i}\n" for i in range(1, 5001)]
    (ws / "big.log").write_text("".join(lines))
    (_, attached) = blocks(expand_prompt("@big.log", ws))
    text = attached.text
    assert text.startswith('<file path="big.log">\nline 1\n')
    assert f"line {TEXT_CAP_LINES}\n" in text and f"line {TEXT_CAP_LINES + 1}\n" not in text
    assert text.endswith(f"[truncated: first {TEXT_CAP_LINES} of 5000 lines]\n</file>")


def test_a_text_file_with_long_lines_is_cut_at_the_byte_cap_on_a_line_boundary(ws: Path) -> None:
    line = "x" * 999 + "\n"  # 1,000 bytes a line: 100 KiB holds 102 whole lines
    (ws / "wide.txt").write_text(line * 300)
    (_, attached) = blocks(expand_prompt("@wide.txt", ws))
    assert attached.text.count(line) == 102
    assert attached.text.endswith("[truncated: first 102 of 300 lines]\n</file>")


def test_a_binary_file_says_what_it_is_and_is_not_attached(ws: Path) -> None:
    (ws / "a.out").write_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 2000)
    (_, attached) = blocks(expand_prompt("what is @a.out", ws))
    assert attached.text == (
        '<file path="a.out" binary="true">[a binary file of 2 KB: not attached]</file>'
    )


def test_a_directory_attaches_its_listing(ws: Path) -> None:
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "b.py").write_text("")
    (ws / "pkg" / "a.py").write_text("")
    out = expand("what is in @pkg/", ws)
    assert blocks(out.prompt)[1] == TextBlock(
        '<directory path="pkg/">\na.py\nb.py\nsub/\n</directory>'
    )
    assert out.notes == ("attached the listing of pkg/",)


def test_an_at_word_naming_nothing_stays_text_with_a_note(ws: Path) -> None:
    out = expand("why does @property break @staticmethod", ws)
    assert out.prompt == "why does @property break @staticmethod"
    assert out.notes == (
        "@property: no such file or directory; sent as text",
        "@staticmethod: no such file or directory; sent as text",
    )


def test_at_an_image_attaches_the_image_in_place(ws: Path) -> None:
    prompt = blocks(expand_prompt("compare @shot.png with the design", ws))
    assert [type(b) for b in prompt] == [TextBlock, ImageBlock, TextBlock]


def test_a_file_outside_the_workspace_is_attached_and_a_link_is_named(
    ws: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("outside words\n")
    out = expand(f"read @{secret}", ws)
    assert blocks(out.prompt)[1] == TextBlock(f'<file path="{secret}">\noutside words\n</file>')
    (ws / "innocent.txt").symlink_to(secret)
    linked = expand("read @innocent.txt", ws)
    assert blocks(linked.prompt)[1] == TextBlock(
        f'<file path="innocent.txt" target="{secret}">\noutside words\n</file>'
    )
    assert linked.notes == (f"attached innocent.txt (a link to {secret})",)


def test_a_fifo_is_never_opened(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    out = expand("read @pipe", ws)  # opening it would block until a writer came
    assert out.prompt == "read @pipe"
    assert out.notes == ("@pipe: not a regular file; not opened, sent as text",)


def test_a_prompt_that_attaches_nothing_is_returned_as_is(ws: Path) -> None:
    assert expand_prompt("just words, about app.py", ws) == "just words, about app.py"


# --------------------------------------------------------------------------- on the wire


def openai_agent(server: SSEServer, ws: Path) -> Agent:
    adapter = OpenAICompatAdapter(model="gpt-4o", api_key="sk-test", base_url=server.url + "/v1")
    return Agent(adapter=adapter, store=MemorySessionStore(), workspace=ws, tools=[])


def anthropic_agent(server: SSEServer, ws: Path) -> Agent:
    adapter = AnthropicAdapter(model="claude-test-1", api_key="sk-ant", base_url=server.url)
    return Agent(adapter=adapter, store=MemorySessionStore(), workspace=ws, tools=[])


def test_the_image_reaches_an_openai_compatible_server_in_base64(ws: Path) -> None:
    expected = base64.b64encode(png()).decode()
    prompt = expand_prompt("what is in shot.png?", ws)
    with (
        SSEServer([text_reply("A green pixel.")]) as server,
        openai_agent(server, ws).session("img") as session,
    ):
        seen = list(session.run_sync(prompt))
        log = list(session.events)
    assert seen[-1].outcome.kind == "completed"  # type: ignore[attr-defined]
    (user,) = [m for m in server.requests[0].json["messages"] if m["role"] == "user"]
    assert user["content"] == [
        {"type": "text", "text": "what is in shot.png?"},  # the image follows its token
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{expected}"}},
    ]
    (recorded,) = [e for e in log if isinstance(e, User)]
    assert isinstance(recorded.content, tuple) and recorded.content[1] == ImageBlock(
        "image/png", data=expected
    )  # durable in the log as sent


def test_the_image_reaches_the_anthropic_api_in_base64(ws: Path) -> None:
    expected = base64.b64encode(png()).decode()
    prompt = expand_prompt("@shot.png describe it", ws)
    reply = Stream([Event(d, event=k) for k, d in turn(text_block(0, "A pixel.")).events])
    with SSEServer([reply]) as server, anthropic_agent(server, ws).session("img") as session:
        seen = list(session.run_sync(prompt))
    assert seen[-1].outcome.kind == "completed", seen[-1]  # type: ignore[attr-defined]
    (message,) = server.requests[0].json["messages"]
    assert message["role"] == "user"
    parts = [p for p in message["content"] if p["type"] != "text" or p["text"].strip()]
    assert parts[0]["type"] == "text" and parts[0]["text"] == "@shot.png"
    assert parts[1]["type"] == "image"
    assert parts[1]["source"] == {"type": "base64", "media_type": "image/png", "data": expected}
    assert parts[2]["text"] == " describe it"
