"""Plan mode, the document's flow: the model answers with one KML envelope, the client runs it.

Each model turn is parsed (:func:`kyronix.kml.parse`) and checked against the agent's tools
(:func:`~kyronix.server.agents.check_plan`). An answer that fits is the run's outcome: its
envelope gets server-assigned execution ids (:func:`~kyronix.server.agents.finalize`) and is
recorded with the turn's ``run_ended`` (one commit), its charge settled in that same
transaction on the SQL store. An answer that does not fit is sent back once, with its problems
(a second kiso run, ``source: system``); a second bad answer fails the run ``invalid_kml``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from kiso.kernel import Assistant
from kiso.runtime import Agent, RunEvent, Session
from kiso.runtime.rules import RulesFile
from kyronix import kml
from kyronix.errors import KmlError
from kyronix.server.agents import Persona, check_plan, finalize
from kyronix.server.config import ServerConfig
from kyronix.server.models import ModelChoice
from kyronix.server.runs.drive import Attempt
from kyronix.server.runs.handle import RunHandle, RunRequest
from kyronix.server.runs.outcome import Meter, Outcome, charge
from kyronix.server.runs.settle import Settlement
from kyronix.server.sessions import with_results

__all__ = ["PlanMode"]

CORRECTIONS = 1
"""How many times a bad answer is sent back to the model."""


class PlanMode:
    key: str | None = None

    def __init__(
        self,
        config: ServerConfig,
        models: ModelChoice,
        *,
        store: object,
        workspace: Path,
        settlement: Settlement,
        id_key: bytes = b"",
    ) -> None:
        self.config = config
        self.models = models
        self.store = store
        self.workspace = workspace
        self.settlement = settlement
        self.id_key = id_key
        """What signs the plans' tool ids (:func:`~kyronix.server.agents.issued_by`)."""
        self._rules = RulesFile(config.home / "rules.json")  # never written: no tool runs here
        self._agents: dict[str, Agent] = {}

    def agent(self, persona: Persona, project_id: str) -> Agent:
        agent = self._agents.get(persona.id) if not persona.custom else None
        if agent is None:
            agent = Agent(
                adapter=self.models.adapter(persona),
                tools=(),
                store=self.store,  # type: ignore[arg-type]
                system_prompt=persona.instructions,
                workspace=self.workspace,
                rules=self._rules,
                max_turns=1,
                max_retries=2,
                trigger="api",
                home=self.config.home,
            )
            if not persona.custom:  # a custom agent may be edited: built each run
                self._agents[persona.id] = agent
        return agent

    def course(
        self, handle: RunHandle, session: Session, persona: Persona, req: RunRequest, *,
        resume: bool,
    ) -> PlanCourse:  # fmt: skip
        return PlanCourse(self, handle, session, persona, req)


class PlanCourse:
    def __init__(
        self, mode: PlanMode, handle: RunHandle, session: Session, persona: Persona, req: RunRequest
    ) -> None:
        self.mode = mode
        self.handle = handle
        self.session = session
        self.persona = persona
        self.req = req
        self.corrections = 0
        self.problems: list[str] = []
        self.accepted: Outcome | None = None
        self.texts: list[str] = []
        """The text of each attempt before this one."""

    def start(self) -> AsyncIterator[RunEvent]:
        prompt = with_results(self.req.input, self.session.events)
        return self.session.run(prompt, source="user")

    def turn(self, turn: Assistant, meter: Meter) -> None:
        text = turn.text
        try:
            plan = kml.parse(text)
            self.problems = check_plan(plan, self.persona)
        except KmlError as exc:
            self.problems = [f"the answer is not valid KML: {exc}"]
            return
        if not text or self.problems:
            return
        response, ids = finalize(plan, turn.run, self.mode.id_key)
        handle = self.handle
        outcome = Outcome(
            handle.id, handle.session_id, 200, response=response, execution_ids=tuple(ids),
            cost=charge(self.mode.config, meter.usd), usage=meter.usage,
            texts=[*self.texts, text], issues_ids=True, key_id=self.req.key_id,
        )  # fmt: skip
        # recorded (and charged) with the turn's run_ended: one commit, not two
        self.mode.settlement.stage(self.session, outcome, handle.project_id, run=turn.run)
        self.accepted = outcome

    async def end(
        self, attempt: Attempt, meter: Meter, texts: list[str]
    ) -> Outcome | AsyncIterator[RunEvent]:
        self.texts = list(texts)
        handle = self.handle
        why = attempt.failed(need_text=True)
        if why is not None:
            return Outcome.failure(
                handle.id, handle.session_id, 502, "model_error", f"the model failed: {why}",
                details={"runId": handle.id}, texts=list(texts), usage=meter.usage,
            )  # fmt: skip
        if self.accepted is not None:
            return self.accepted
        if self.corrections >= CORRECTIONS:
            return Outcome.failure(
                handle.id, handle.session_id, 502, "invalid_kml",
                "the model's answer did not fit the agent's tools, even after a correction",
                details={"runId": handle.id, "problems": self.problems[:10]},
                texts=list(texts), usage=meter.usage,
            )  # fmt: skip
        self.corrections += 1
        prompt = (
            "Your answer was not accepted:\n- "
            + "\n- ".join(self.problems[:10])
            + "\nAnswer again with one corrected <kyronix> envelope, using only the listed "
            "tools and their parameters."
        )
        return self.session.run(prompt, source="system")
