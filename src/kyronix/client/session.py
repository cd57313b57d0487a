"""Sessions: multi-turn runs that share one conversation (a kiso session at the server).

:class:`Session` (from :meth:`Kyronix.create_session`) and :class:`AsyncSession` (from
:meth:`AsyncKyronix.create_session`) hold the session's id and the agent it was made for;
``send`` runs that agent again in the session, so the model sees every turn so far.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kyronix.client import _base
from kyronix.errors import APIError

if TYPE_CHECKING:
    from kyronix.client.async_ import AsyncKyronix
    from kyronix.client.response import RunResponse
    from kyronix.client.sync import Kyronix

__all__ = ["AsyncSession", "Session"]


class _SessionBase:
    def __init__(
        self,
        session_id: str,
        agent: str,
        custom_agent_id: str | None,
        project_id: str | None,
    ) -> None:
        self._id = session_id
        self.agent = agent
        """The built-in agent ``send`` runs (unless a custom agent is in play)."""
        self.custom_agent_id = custom_agent_id
        """The custom agent the session was made for, or None."""
        self.project_id = project_id

    @property
    def id(self) -> str:
        return self._id

    def get_id(self) -> str:
        """The session's id (``sess_…``)."""
        return self._id

    def _custom(self, custom_agent_id: str | None) -> str | None:
        return custom_agent_id if custom_agent_id is not None else self.custom_agent_id

    def __repr__(self) -> str:
        agent = self.custom_agent_id or self.agent
        return f"{type(self).__name__}(id={self._id!r}, agent={agent!r})"


def _messages(history: dict[str, Any]) -> list[dict[str, Any]]:
    chat = history.get("chat")
    if not isinstance(chat, list):
        raise APIError(
            "the session's history has no 'chat' list; is base_url a Kyronix server?",
            code="invalid_response",
        )
    return chat


def session_id_of(made: Any) -> str:
    """The id in the answer to ``POST /api/sessions``."""
    if isinstance(made, dict) and isinstance(made.get("id"), str) and made["id"]:
        return str(made["id"])
    raise APIError("the server's answer to POST /api/sessions has no 'id'", code="invalid_response")


def _history(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError("the session's history is not a JSON object", code="invalid_response")
    return body


class Session(_SessionBase):
    """A session of a :class:`Kyronix` client."""

    def __init__(
        self,
        client: Kyronix,
        session_id: str,
        agent: str = "coding",
        custom_agent_id: str | None = None,
        project_id: str | None = None,
    ) -> None:
        super().__init__(session_id, agent, custom_agent_id, project_id)
        self._client = client

    def send(
        self,
        input: str,
        agent: str | None = None,
        custom_agent_id: str | None = None,
        timeout: float | None = None,
        *,
        execute: _base.Execute | None = None,
    ) -> RunResponse:
        """Run the session's agent on ``input``, in this session (custom agent: ``POST
        /api/customagents/run``; built-in: ``POST /api/agents/{agent}``)."""
        custom = self._custom(custom_agent_id)
        if custom is not None:
            return self._client.run_custom_agent(
                custom, input, project_id=self.project_id, session_id=self._id,
                timeout=timeout, execute=execute,
            )  # fmt: skip
        return self._client.run(
            agent or self.agent, input, project_id=self.project_id, session_id=self._id,
            timeout=timeout, execute=execute,
        )  # fmt: skip

    def get_history(self) -> dict[str, Any]:
        """``GET /api/sessions/{id}``: ``{"id", "agentId", "chat": [...]}``."""
        return _history(self._client._send(_base.history_call(self._id)))

    def get_messages(self) -> list[dict[str, Any]]:
        """The ``chat`` of :meth:`get_history`: ``[{"role", "content", …}]`` in order."""
        return _messages(self.get_history())


class AsyncSession(_SessionBase):
    """A session of an :class:`AsyncKyronix` client (the same methods, awaited)."""

    def __init__(
        self,
        client: AsyncKyronix,
        session_id: str,
        agent: str = "coding",
        custom_agent_id: str | None = None,
        project_id: str | None = None,
    ) -> None:
        super().__init__(session_id, agent, custom_agent_id, project_id)
        self._client = client

    async def send(
        self,
        input: str,
        agent: str | None = None,
        custom_agent_id: str | None = None,
        timeout: float | None = None,
        *,
        execute: _base.Execute | None = None,
    ) -> RunResponse:
        """Run the session's agent on ``input``, in this session (custom agent: ``POST
        /api/customagents/run``; built-in: ``POST /api/agents/{agent}``)."""
        custom = self._custom(custom_agent_id)
        if custom is not None:
            return await self._client.run_custom_agent(
                custom, input, project_id=self.project_id, session_id=self._id,
                timeout=timeout, execute=execute,
            )  # fmt: skip
        return await self._client.run(
            agent or self.agent, input, project_id=self.project_id, session_id=self._id,
            timeout=timeout, execute=execute,
        )  # fmt: skip

    async def get_history(self) -> dict[str, Any]:
        """``GET /api/sessions/{id}``: ``{"id", "agentId", "chat": [...]}``."""
        return _history(await self._client._send(_base.history_call(self._id)))

    async def get_messages(self) -> list[dict[str, Any]]:
        """The ``chat`` of :meth:`get_history`: ``[{"role", "content", …}]`` in order."""
        return _messages(await self.get_history())
