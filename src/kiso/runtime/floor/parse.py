"""Parsing: tree-sitter-bash, and the tolerant tokenizer for what it cannot read."""

from __future__ import annotations

import tree_sitter_bash
from tree_sitter import Language, Parser, Tree

__all__ = ["SEPARATORS", "parse", "tolerant_tokens"]


# --------------------------------------------------------------------------------------------
# The fallback tokenizer

SEPARATORS = "();<>|&`\n"


def tolerant_tokens(source: str) -> list[str]:
    """Split into words and operator characters as the shell would, never failing.

    Quotes and backslashes are honoured; a quote left open runs to the end. Each character of
    :data:`SEPARATORS` outside quotes is a token of its own.
    """
    tokens: list[str] = []
    word: list[str] = []
    quote = ""
    quoted = False  # the word so far had quotes, so is a word even when empty
    i = 0
    while i < len(source):
        char = source[i]
        following = source[i + 1] if i + 1 < len(source) else ""
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"' and following and following in '"\\$`':
                word.append(following)
                i += 1
            else:
                word.append(char)
        elif char == "\\":
            if following != "\n":
                word.append(following)
            i += 1
        elif char in "'\"":
            quote, quoted = char, True
        elif char in " \t\r" or char in SEPARATORS:
            if word or quoted:
                tokens.append("".join(word))
            word, quoted = [], False
            if char in SEPARATORS:
                tokens.append(char)
        else:
            word.append(char)
        i += 1
    if word or quoted:
        tokens.append("".join(word))
    return tokens


# --------------------------------------------------------------------------------------------
# The parser

_LANGUAGE = Language(tree_sitter_bash.language())


def parse(source: bytes) -> Tree:
    """Parse with tree-sitter-bash, every non-ASCII byte read as ``x``.

    tree-sitter-bash 0.25 can crash the process on ``{`` followed by a 4-byte UTF-8 character
    (tree-sitter/tree-sitter-bash#337). Bash gives no non-ASCII character a meaning of its own,
    so reading each such byte as a letter keeps the parse, and the byte offsets, the same; the
    text of every node is then taken from the real source.
    """
    ascii_only = source.translate(_ASCII_ONLY)
    return Parser(_LANGUAGE).parse(ascii_only)


_ASCII_ONLY = bytes(range(128)) + b"x" * 128
