"""docs/sdk.md runs: every ```python block, in order, against a real server and executer."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kyronix.executer import KyronixExecuter

from .conftest import Served

pytestmark = pytest.mark.timeout(120)

DOC = Path(__file__).resolve().parents[3] / "docs" / "sdk.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def executer(server: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("project")
    daemon = KyronixExecuter(
        ws_url=server.url.replace("http://", "ws://") + "/ws",
        api_key=server.key,
        base_path=base,
        receipts=base.parent / "docs-receipts.sqlite3",
    )
    with daemon:
        assert daemon.wait_connected(30)
        yield base


@pytest.fixture(scope="module")
def outputs(server: Served, executer: Path) -> dict[int, str | BaseException]:
    """What each example printed (or raised), run once each, in order, with the environment
    the doc's setup gives them."""
    got: dict[int, str | BaseException] = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KYRONIX_API_KEY", server.key)
        env.setenv("KYRONIX_BASE_URL", server.url)
        for index, code in enumerate(BLOCKS):
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(code, f"docs/sdk.md[{index}]", "exec"), {"__name__": "__main__"})
            except Exception as exc:
                got[index] = exc
            else:
                got[index] = out.getvalue()
    return got


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_example_runs(index: int, outputs: dict[int, str | BaseException]) -> None:
    printed = outputs[index]
    if isinstance(printed, BaseException):
        raise printed
    assert printed.strip(), "every example prints what it got"


def test_what_the_examples_print(outputs: dict[int, str | BaseException], executer: Path) -> None:
    """The examples' claims: the plan ran at the executer, the errors are the documented ones."""
    joined = "\n".join(str(v) for v in outputs.values())
    assert "write_file True" in str(outputs[0])
    assert (executer / "src" / "hello.py").exists() and (executer / "notes" / "todo.txt").exists()
    assert "not resolved: not_uncertain" in joined
    assert "404: no project 'proj_notmine1'" in joined
