"""The wire shapes of the API (pydantic): what a body must be, and what each route answers.

Ids carry tight patterns (``kyr_…``, ``proj_…``, ``sess_…``, ``run_…``, ``exec_…``, 64-hex
custom agent ids) so the published OpenAPI document says exactly what is accepted, and a fuzzer
working from it reaches the code behind the validation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kyronix.errors import KyronixUsageError

__all__ = [
    "AgentInfo",
    "AgentList",
    "ChatMessage",
    "CreditsInfo",
    "CustomAgent",
    "CustomAgentCreate",
    "CustomAgentDeleted",
    "CustomAgentPatch",
    "CustomRunBody",
    "CustomTool",
    "ErrorResponse",
    "RunBody",
    "RunResult",
    "SessionBody",
    "SessionCreated",
    "SessionView",
]

PROJECT_ID = r"^proj_[A-Za-z0-9]{4,60}$"
SESSION_ID = r"^sess_[A-Za-z0-9]{4,60}$"
RUN_ID = r"^run_[A-Za-z0-9]{4,60}$"
CUSTOM_AGENT_ID = r"^[0-9a-f]{64}$"
AGENT_SLUG = r"^[A-Za-z0-9_-]{1,64}$"
NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
EXEC_ID = r"^exec_[0-9a-f]{32}$"
MAX_INPUT = 200_000

_STRICT = ConfigDict(extra="forbid", strict=True)

ProjectId = Annotated[str, Field(pattern=PROJECT_ID, description="a project id (proj_…)")]
SessionId = Annotated[str, Field(pattern=SESSION_ID, description="a session id (sess_…)")]
CustomAgentId = Annotated[
    str, Field(pattern=CUSTOM_AGENT_ID, description="a custom agent's 64-hex id")
]
Input = Annotated[str, Field(min_length=1, max_length=MAX_INPUT, description="the prompt")]


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, object]


class ErrorResponse(BaseModel):
    error: ErrorDetail


Execute = Annotated[
    Literal["tunnel"],
    Field(
        description='"tunnel": the server runs the agent loop, each tool call over the WebSocket '
        "tunnel to the project's executer, and answers with the final response and every result"
    ),
]


class RunBody(BaseModel):
    model_config = _STRICT
    input: Input
    projectId: ProjectId | None = None
    sessionId: SessionId | None = None
    customAgentId: CustomAgentId | None = None
    execute: Execute | None = None


class CustomRunBody(BaseModel):
    model_config = _STRICT
    agentId: CustomAgentId
    input: Input
    projectId: ProjectId | None = None
    sessionId: SessionId | None = None
    execute: Execute | None = None


class Usage(BaseModel):
    input: int
    output: int


class RunResult(BaseModel):
    response: str = Field(description="the KML envelope")
    sessionId: str = Field(pattern=SESSION_ID)
    creditsRemaining: float
    usage: Usage
    cost: float
    executionIds: list[Annotated[str, Field(pattern=EXEC_ID)]]
    runId: str = Field(pattern=RUN_ID)
    results: list[dict[str, Any]] | None = Field(
        default=None, description='with "execute": "tunnel": every tool\'s result entry'
    )


class SessionBody(BaseModel):
    model_config = _STRICT
    agent: Annotated[str, Field(pattern=AGENT_SLUG)] | None = None
    customAgentId: CustomAgentId | None = None
    projectId: ProjectId | None = None


class SessionCreated(BaseModel):
    id: str = Field(pattern=SESSION_ID)
    agentId: str


class ChatMessage(BaseModel):
    role: str = Field(description="user, assistant, or tool (what an executer answered)")
    content: str
    status: str | None = None
    runId: str | None = None
    requestId: str | None = None
    results: list[dict[str, Any]] | None = None


class SessionView(BaseModel):
    id: str = Field(pattern=SESSION_ID)
    agentId: str
    chat: list[ChatMessage]


class CustomTool(BaseModel):
    model_config = _STRICT
    name: Annotated[str, Field(pattern=NAME)]
    description: Annotated[str, Field(max_length=2000)] = ""
    params: Annotated[list[Annotated[str, Field(pattern=NAME)]], Field(max_length=32)] = []
    disabled: bool = False

    @field_validator("params")
    @classmethod
    def _unique_params(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise KyronixUsageError("parameter names must be unique")
        return value


def _unique_tools(tools: list[CustomTool] | None) -> list[CustomTool] | None:
    if tools is not None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise KyronixUsageError("tool names must be unique within an agent")
    return tools


class CustomAgentCreate(BaseModel):
    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=128)]
    description: Annotated[str, Field(max_length=2000)] = ""
    tools: Annotated[list[CustomTool], Field(max_length=64)] = []

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[CustomTool] | None) -> list[CustomTool] | None:
        return _unique_tools(value)


class CustomAgentPatch(BaseModel):
    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    description: Annotated[str, Field(max_length=2000)] | None = None
    tools: Annotated[list[CustomTool], Field(max_length=64)] | None = None

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[CustomTool] | None) -> list[CustomTool] | None:
        return _unique_tools(value)


class CustomAgent(BaseModel):
    id: str = Field(pattern=CUSTOM_AGENT_ID)
    name: str
    description: str
    tools: list[CustomTool]


class CustomAgentDeleted(BaseModel):
    id: str = Field(pattern=CUSTOM_AGENT_ID)
    deleted: bool


class ToolInfo(BaseModel):
    name: str
    description: str
    params: list[str]


class AgentInfo(BaseModel):
    id: str
    description: str
    tools: list[ToolInfo]


class AgentList(BaseModel):
    agents: list[AgentInfo]


class CreditsInfo(BaseModel):
    projectId: str = Field(pattern=PROJECT_ID)
    credits: float
    held: float
