"""`kiso --help`, rendered by click and kept here so that printing it imports nothing.

tests/cli/test_cli.py checks it is exactly what click renders, so it cannot drift. Regenerate it
after changing the command line: ``python -m kiso.cli.help``.
"""

from __future__ import annotations

HELP = 'Usage: kiso [OPTIONS] [COMMAND] [ARGS]...\n\n  kiso: a durable coding agent. Every approval, tool result and event is on disk\n  before it is acted on, so a session that is interrupted, crashes or is killed\n  resumes where it was.\n\n  kiso [sessionId]               interactive session (`kiso chat` is the same)\n  kiso "fix the failing tests"   interactive session, starting with that prompt\n  kiso -c                        continue the latest session of this directory\n  kiso -p "prompt" [sessionId]   one prompt, no UI; exit 0 only if the run completed\n  cat f | kiso -p "explain"      piped stdin is added to the prompt (-p - reads it all)\n  kiso resume                    pick a session to continue\n  kiso resume <id> [prompt]      continue a session (headless when stdin is not a terminal)\n  kiso sessions [--all]          durable sessions and the state each resumes into\n  kiso doctor <id>               repair a damaged log; nothing with a receipt runs again\n\n  Exit codes: 0 done, 1 the run failed or did not complete, 2 a usage error.\n  Sessions live in $KISO_HOME/projects (KISO_HOME defaults to ~/.kiso).\n\nOptions:\n  -v, --version                   Show the version and exit.\n  -p, --print PROMPT              Run one prompt with no UI. A bare -p, or -p -,\n                                  reads the prompt from stdin.\n  -c, --continue                  Continue the most recent session of this\n                                  directory.\n  --model TEXT                    A profile name, or provider/model.\n  --mode TEXT                     default, accept-edits, plan, dontAsk or\n                                  bypass.\n  --output-format [text|json|stream-json]\n                                  Print mode: plain text, one JSON result, or\n                                  one JSON event per line.  [default: text]\n  --resolve [rerun|skip|applied]  Headless runs: how to rule on uncertain\n                                  executions (otherwise they stop the run).\n  --append-system-prompt TEXT     Text added after the built-in system prompt.\n  --system-prompt-file FILE       A file whose text replaces the built-in system\n                                  prompt.\n  --sandbox [workspace-write|read-only|off]\n                                  The OS sandbox for commands (default\n                                  workspace-write; docs/sandbox.md).\n  --allowed-tools, --allowedTools TEXT\n                                  Tool patterns allowed without asking, comma-\n                                  or space-separated, repeatable: "shell(npm\n                                  test),shell(git diff:*) edit_file(src/**)".\n  --disallowed-tools, --disallowedTools TEXT\n                                  Tool patterns denied in every mode (a whole\n                                  tool is not offered at all).\n  --max-turns INTEGER RANGE       End a run with outcome max_turns after N model\n                                  turns (default 50).  [x>=1]\n  --max-budget-usd USD            End a run with outcome budget once it has cost\n                                  X US dollars.\n  -h, --help                      Show this message and exit.\n\nCommands:\n  auth      Show stored credentials (masked) and which key variables are set.\n  chat      The interactive session (or print mode with -p).\n  demo      Run a durable session, kill it with SIGKILL mid-tool-call, and...\n  doctor    Repair a damaged session log without running again anything...\n  login     Store an API key for PROVIDER (anthropic, openai, deepseek,...\n  logout    Remove the stored key for PROVIDER.\n  resume    Continue a session: with no id, pick one; headless when stdin...\n  sessions  List durable sessions with the state each would resume into.\n  trust     Trust (or, with --revoke, stop trusting) a project\'s .kiso/...\n  update    Upgrade kiso the way it was installed (pipx, uv tool or pip).\n'


def _regenerate() -> None:
    """Rewrite this file with click's rendering of ``kiso --help`` at 80 columns."""
    from pathlib import Path

    from click.testing import CliRunner

    from kiso.cli.main import cli

    rendered = CliRunner().invoke(cli, ["--help"], prog_name="kiso", terminal_width=80).output
    path = Path(__file__)
    text = path.read_text(encoding="utf-8")
    start = text.index("HELP = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + f"HELP = {rendered!r}" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    _regenerate()
