"""Skills: discovery, the user/project cascade, the trust gate, bad files, read_skill in a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ExecutionFinished, MemorySessionStore
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.skills import (
    BODY_CAP,
    SkillError,
    discover_skills,
    find_skill,
    parse_frontmatter,
    parse_skill,
    read_skill_tool,
    skill_turn,
    skills_prompt,
)
from kiso.runtime.trust import gate

NO_ENV: dict[str, str] = {}


def put(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def skill_md(name: str, description: str, body: str = "Do the thing.\n") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}"


# ------------------------------------------------------------------------------- pure parsing


def test_frontmatter_is_parsed_and_the_body_is_what_follows() -> None:
    values, body = parse_frontmatter(
        "---\nname: release\n# a comment\ndescription: 'Cut: a release'\n---\nStep 1\n"
    )
    assert values == {"name": "release", "description": "Cut: a release"}
    assert body == "Step 1\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("just text\n", "has no frontmatter"),
        ("---\nname: x\ndescription: y\n", "never closed"),
        ("---\nname x\n---\n", "not 'key: value'"),
        ("---\ndescription: y\n---\n", "has no 'name'"),
        ("---\nname: x\n---\n", "has no 'description'"),
        ("---\nname: other\ndescription: y\n---\n", "differs from its directory 'x'"),
    ],
)
def test_a_bad_skill_file_is_an_error_naming_the_file(text: str, said: str) -> None:
    with pytest.raises(SkillError, match=said) as caught:
        parse_skill("x", text, path="/skills/x/SKILL.md")
    assert "/skills/x/SKILL.md" in str(caught.value)


def test_the_index_has_one_line_per_skill_sorted_and_nothing_without_skills() -> None:
    a = parse_skill("b-skill", skill_md("b-skill", "second"), path="/s/b/SKILL.md")
    b = parse_skill("a-skill", skill_md("a-skill", "first\n"), path="/s/a/SKILL.md")
    text = skills_prompt([a, b])
    assert text.splitlines()[1:] == ["- a-skill: first", "- b-skill: second"]
    assert "read_skill" in text.splitlines()[0]
    assert skills_prompt([]) == ""


def test_a_skill_turn_names_the_skill_and_carries_the_arguments() -> None:
    s = parse_skill("release", skill_md("release", "Cut a release"), path="/s/SKILL.md")
    assert "'release'" in skill_turn(s) and "Arguments" not in skill_turn(s)
    assert skill_turn(s, "  v1.2 ").endswith("\nArguments: v1.2")


# ---------------------------------------------------------------------------------- discovery


def test_user_skills_are_found_and_bad_ones_are_notices(home: Path) -> None:
    root = home / "skills"
    put(root / "good" / "SKILL.md", skill_md("good", "A good skill"))
    put(root / "nofront" / "SKILL.md", "no frontmatter here\n")
    put(root / "mismatch" / "SKILL.md", skill_md("other", "wrong name"))
    (root / "empty").mkdir()
    found = discover_skills(home, environ=NO_ENV)
    assert [s.name for s in found.skills] == ["good"]
    notices = "\n".join(found.notices)
    assert str(root / "nofront" / "SKILL.md") in notices
    assert str(root / "mismatch" / "SKILL.md") in notices
    assert str(root / "empty") in notices
    assert len(found.notices) == 3


def test_kiso_skills_dir_overrides_the_home_directory(home: Path, tmp_path: Path) -> None:
    put(home / "skills" / "homeone" / "SKILL.md", skill_md("homeone", "in home"))
    other = tmp_path / "elsewhere"
    put(other / "there" / "SKILL.md", skill_md("there", "in the override"))
    found = discover_skills(home, environ={"KISO_SKILLS_DIR": str(other)})
    assert [s.name for s in found.skills] == ["there"]


def test_a_symlinked_skill_file_is_not_followed(home: Path, tmp_path: Path) -> None:
    secret = put(tmp_path / "secret.md", skill_md("linked", "x"))
    (home / "skills" / "linked").mkdir(parents=True)
    (home / "skills" / "linked" / "SKILL.md").symlink_to(secret)
    found = discover_skills(home, environ=NO_ENV)
    assert found.skills == ()
    assert "symbolic link" in found.notices[0]


def test_project_skills_apply_only_once_trusted(home: Path, workspace: Path) -> None:
    put(workspace / ".kiso" / "skills" / "proj" / "SKILL.md", skill_md("proj", "From the repo"))
    refused = gate(workspace, home, ask=lambda c: False)
    assert refused.project_files is None
    assert discover_skills(home, environ=NO_ENV, project_files=refused.project_files).skills == ()
    (home / "trust.json").unlink()
    trusted = gate(workspace, home, ask=lambda c: True)
    found = discover_skills(
        home, environ=NO_ENV, project_files=trusted.project_files, project_root=workspace
    )
    assert [(s.name, s.source) for s in found.skills] == [("proj", "project")]


def test_a_project_skill_is_read_from_the_trusted_bytes_not_the_disk(
    home: Path, workspace: Path
) -> None:
    path = put(
        workspace / ".kiso" / "skills" / "proj" / "SKILL.md",
        skill_md("proj", "From the repo", "TRUSTED BODY\n"),
    )
    trusted = gate(workspace, home, ask=lambda c: True)
    path.write_text(skill_md("proj", "swapped", "EVIL BODY\n"))  # changed after the review
    found = discover_skills(home, environ=NO_ENV, project_files=trusted.project_files)
    (skill,) = found.skills
    assert skill.body == "TRUSTED BODY\n" and skill.description == "From the repo"


def test_a_project_never_shadows_a_users_skill(home: Path, workspace: Path) -> None:
    put(home / "skills" / "deploy" / "SKILL.md", skill_md("deploy", "mine", "MY STEPS\n"))
    put(workspace / ".kiso" / "skills" / "deploy" / "SKILL.md", skill_md("deploy", "theirs"))
    put(workspace / ".kiso" / "skills" / "lint" / "SKILL.md", skill_md("lint", "theirs too"))
    trusted = gate(workspace, home, ask=lambda c: True)
    found = discover_skills(
        home, environ=NO_ENV, project_files=trusted.project_files, project_root=workspace
    )
    deploy = find_skill(found.skills, "deploy")
    assert deploy is not None and deploy.source == "user" and deploy.body == "MY STEPS\n"
    assert [s.name for s in found.skills] == ["deploy", "lint"]
    (notice,) = found.notices
    assert "deploy" in notice and str(home / "skills" / "deploy" / "SKILL.md") in notice
    assert "project" in notice


def test_a_bad_project_skill_is_a_notice(home: Path, workspace: Path) -> None:
    put(workspace / ".kiso" / "skills" / "bad" / "SKILL.md", "---\nname: bad\n---\n")
    trusted = gate(workspace, home, ask=lambda c: True)
    found = discover_skills(
        home, environ=NO_ENV, project_files=trusted.project_files, project_root=workspace
    )
    assert found.skills == ()
    assert str(workspace / ".kiso" / "skills" / "bad" / "SKILL.md") in found.notices[0]


# ------------------------------------------------------------------------- read_skill in a run


def _run(tmp_path: Path, calls: list[dict[str, Any]], skills: Any) -> list[ExecutionFinished]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_skill", "input": c}]} for c in calls
    ]
    agent = Agent(
        adapter=FauxAdapter([*turns, {"text": "done"}]),
        tools=[read_skill_tool(skills)],
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode="default",  # a read-only tool: no question in the default mode
    )
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("use the skill")]
        events = list(session.events)
    assert "approval_request" not in seen and seen[-1] == "terminal"
    return [e for e in events if isinstance(e, ExecutionFinished)]


def test_read_skill_returns_the_body_and_lists_skills_for_an_unknown_name(
    home: Path, tmp_path: Path
) -> None:
    put(home / "skills" / "release" / "SKILL.md", skill_md("release", "x", "Tag it, then push.\n"))
    put(home / "skills" / "audit" / "SKILL.md", skill_md("audit", "y"))
    skills = discover_skills(home, environ=NO_ENV).skills
    found, unknown = _run(tmp_path, [{"name": "release"}, {"name": "nope"}], skills)
    assert not found.is_error and found.content.endswith("Tag it, then push.\n")
    assert "---" not in found.content  # the frontmatter is the index line, not the body
    assert unknown.is_error
    assert "'nope'" in unknown.content and "audit, release" in unknown.content


def test_read_skill_caps_the_body_and_says_so(home: Path, tmp_path: Path) -> None:
    put(home / "skills" / "big" / "SKILL.md", skill_md("big", "x", "a" * (BODY_CAP + 500)))
    (result,) = _run(tmp_path, [{"name": "big"}], discover_skills(home, environ=NO_ENV).skills)
    assert result.content.count("a") >= BODY_CAP
    assert f"at most {BODY_CAP}" in result.content
    assert len(result.content.encode()) < BODY_CAP + 1000


def test_read_skill_reads_a_skills_other_files_inside_its_directory_only(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    put(home / "skills" / "mine" / "SKILL.md", skill_md("mine", "x"))
    put(home / "skills" / "mine" / "ref" / "notes.md", "USER NOTES\n")
    put(home / "skills" / "secret.txt", "SECRET\n")
    put(workspace / ".kiso" / "skills" / "proj" / "SKILL.md", skill_md("proj", "y"))
    extra = put(workspace / ".kiso" / "skills" / "proj" / "check.sh", "TRUSTED SCRIPT\n")
    trusted = gate(workspace, home, ask=lambda c: True)
    extra.write_text("CHANGED SCRIPT\n")
    skills = discover_skills(home, environ=NO_ENV, project_files=trusted.project_files).skills
    results = _run(
        tmp_path,
        [
            {"name": "mine", "file": "ref/notes.md"},
            {"name": "proj", "file": "check.sh"},
            {"name": "mine", "file": "../secret.txt"},
            {"name": "proj", "file": "missing.txt"},
        ],
        skills,
    )
    assert [r.content for r in results[:2]] == ["USER NOTES\n", "TRUSTED SCRIPT\n"]
    assert results[2].is_error and "SECRET" not in results[2].content
    assert results[3].is_error and "check.sh" in results[3].content
