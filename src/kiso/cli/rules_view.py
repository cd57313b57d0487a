"""The "don't ask again" rules in force, as ``/status`` lists them: each with where it comes
from (the file and line, and whether it applies in this project or in every project)."""

from __future__ import annotations

import os
from pathlib import Path

from kiso.runtime.rules import RulesError, RulesFile, project_of, unscoped_notice

__all__ = ["rules_rows", "unscoped_notices"]

_told: set[Path] = set()
"""The rules files whose unscoped rules this process has already mentioned."""


def unscoped_notices(rules: RulesFile, workspace: str | os.PathLike[str]) -> list[str]:
    """Once per process and rules file: that rules written without a scope apply in every
    project, and how to scope them (:func:`kiso.runtime.rules.unscoped_notice`). The file is
    read here, so a malformed one is an error when kiso starts, naming the file and line."""
    said = unscoped_notice(rules, workspace)
    if said is None or rules.path in _told:
        return []
    _told.add(rules.path)
    return [said]


def rules_rows(rules: RulesFile, workspace: str | os.PathLike[str]) -> list[str]:
    """``/status``'s rows: ``rules`` (the file, how many are in force here), then one ``rule`` row
    for each rule in force, this project's first. A malformed file is said in the ``rules`` row."""
    project = project_of(workspace)
    try:
        grants = rules.in_force(workspace)
    except RulesError as exc:
        return [f"rules      {exc}"]
    count = f"{len(grants)} in force" if grants else "none in force"
    rows = [f"rules      {rules.path} · {count} in {project}"]
    for grant in grants:
        if grant.project is not None:
            scope = f"this project ({project})"
        elif grant.unscoped:
            scope = "every project (written without a scope)"
        else:
            scope = "every project"
        rows.append(f"rule       {grant.rule.text} · {scope} · {rules.path}:{grant.line}")
    return rows
