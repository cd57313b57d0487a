"""Benchmark 4: the runtime's cost per durable tool round, against fsync and against LangGraph.

One round is one model turn that calls a no-op read-only tool, its verdict, its start and its
receipt: four records, each appended and fsynced on its own, as the loop writes them.

* ``kiso``: the real loop (``Agent`` + ``Session.run``) with the scripted model, JSONL store.
* ``kiso-mem``: the same loop with the in-memory store: what durability costs is the difference.
* ``floor``: the same bytes written with one ``write`` + ``fsync`` per record: the price of the
  guarantee itself. Target: kiso within 2x of it, flat as the session grows.
* ``langgraph``: the same tool loop built on LangGraph (a model node, a tool node, a conditional
  edge) with its SQLite checkpointer in ``sync`` durability, which writes a checkpoint of the
  graph state before each next step. Measured when langgraph is installed (the ``bench`` extra).
"""

import argparse
import asyncio
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.timing import write_and_fsync
from kiso.kernel import JsonlSessionStore, MemorySessionStore
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools.base import define_tool

TARGET = 2.0


def _noop_tool() -> Any:
    return define_tool(
        "noop",
        "Do nothing",
        {"type": "object", "properties": {"i": {"type": "integer"}}},
        lambda args, ctx: "ok",
        effects="read",
    )


def _script(rounds: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "noop", "input": {"i": i}}]} for i in range(rounds)
    ]
    return [*turns, {"text": "done"}]


def run_kiso(rounds: int, root: Path, durable: bool) -> tuple[float, int, Path | None]:
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    store = JsonlSessionStore(root / "home") if durable else MemorySessionStore()
    agent = Agent(
        adapter=FauxAdapter(_script(rounds)),
        tools=[_noop_tool()],
        store=store,
        workspace=ws,
        max_turns=rounds + 5,
    )
    with agent.session() as session:

        async def drive() -> None:
            async for _ in session.run("go"):
                pass

        began = time.perf_counter()
        asyncio.run(drive())
        elapsed = time.perf_counter() - began
        assert session.state.value == "completed", session.state
        path = Path(session._writer.path) if session._writer.path else None
    size = path.stat().st_size if path else 0
    return elapsed, size, path


def run_floor(log: Path, root: Path) -> float:
    return write_and_fsync(log.read_bytes().splitlines(keepends=True), root / "floor.jsonl")


def run_langgraph(rounds: int, root: Path) -> tuple[float, int] | None:
    try:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
    except ImportError:
        return None

    def model(state: MessagesState) -> dict[str, Any]:
        i = len(state["messages"]) // 2
        if i < rounds:
            call = {"name": "noop", "args": {"i": i}, "id": f"call_{i}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="done")]}

    def tools(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        return {"messages": [ToolMessage(content="ok", tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[union-attr]

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    db = root / "langgraph.sqlite"
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        app = graph.compile(checkpointer=SqliteSaver(conn))
        config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 3 * rounds + 10}
        began = time.perf_counter()
        app.invoke(
            {"messages": [HumanMessage(content="go")]},
            config,  # type: ignore[arg-type]
            durability="sync",
        )
        elapsed = time.perf_counter() - began
    finally:
        conn.close()
    size = sum(p.stat().st_size for p in root.glob("langgraph.sqlite*"))
    return elapsed, size


def run(sizes: list[int]) -> list[dict[str, Any]]:
    results = []
    print(
        f"{'rounds':>6}  {'kiso us/round':>13}  {'floor':>8}  {'ratio':>5}  {'mem':>7}  "
        f"{'kiso B/round':>12}  {'langgraph us/round':>18}  {'LG B/round':>10}  {'LG/kiso':>7}"
    )
    for rounds in sizes:
        root = Path(tempfile.mkdtemp(prefix="kiso-bench-rt-", dir=os.environ.get("BENCH_DIR")))
        try:
            t_kiso, size, log = run_kiso(rounds, root / "kiso", durable=True)
            assert log is not None
            t_floor = run_floor(log, root)
            t_mem, _, _ = run_kiso(rounds, root / "mem", durable=False)
            lg = run_langgraph(rounds, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        row: dict[str, Any] = {
            "rounds": rounds,
            "kiso_us": t_kiso / rounds * 1e6,
            "floor_us": t_floor / rounds * 1e6,
            "ratio": t_kiso / t_floor,
            "mem_us": t_mem / rounds * 1e6,
            "kiso_bytes": size / rounds,
        }
        lg_text = f"{'(not installed)':>18}  {'':>10}  {'':>7}"
        if lg is not None:
            row["langgraph_us"] = lg[0] / rounds * 1e6
            row["langgraph_bytes"] = lg[1] / rounds
            row["speedup"] = lg[0] / t_kiso
            lg_text = (
                f"{row['langgraph_us']:18.0f}  {row['langgraph_bytes']:10.0f}  "
                f"{row['speedup']:6.1f}x"
            )
        print(
            f"{rounds:>6}  {row['kiso_us']:13.0f}  {row['floor_us']:8.0f}  {row['ratio']:4.2f}x  "
            f"{row['mem_us']:7.0f}  {row['kiso_bytes']:12.0f}  {lg_text}",
            flush=True,
        )
        results.append(row)
    verdicts = [r["ratio"] <= TARGET for r in results]
    print(f"kiso vs fsync floor: target <= {TARGET}x: {'ok' if all(verdicts) else 'OVER TARGET'}")
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, nargs="+", default=[200, 1000, 2000])
    a = p.parse_args(argv)
    run(a.rounds)


if __name__ == "__main__":
    main()
