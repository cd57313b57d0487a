"""Benchmark: the executer's per-tool overhead, 1,000 ``read_file`` calls against plain ``open()``.

The floor reads the same 1,000 files (1 KiB each) with ``open(path, "rb").read().decode()``. The
executer runs them as one KML envelope of 1,000 ``<tool name="read_file">`` calls: parse,
dispatch, argument conversion, the path sandbox (``realpath``), the permission check, the tool,
and a receipt row per call (read-only tools skip the fsynced ``started`` row). A second figure runs
the 1,000 reads as 1,000 separate ``execute`` calls (one envelope each), the way a chatty agent
would send them. Ratios are executer time over the floor, measured in the same run; a second floor
does the least a sandboxed read must (``realpath``, a containment check, then the read).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from kyronix.executer import SAFE_POLICIES, KyronixExecuter, PermissionManager
from kyronix.kml import Plan, ToolCall, serialize


def _files(root: Path, count: int) -> list[str]:
    names = []
    for i in range(count):
        name = f"src/m{i // 100}/f{i}.txt"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"line {i}\n" * 128)
        names.append(name)
    return names


def run(count: int = 1_000, repeat: int = 3) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        names = _files(root, count)
        executer = KyronixExecuter(
            permissions=PermissionManager(SAFE_POLICIES), receipts=Path(tmp) / "receipts.sqlite3"
        )

        def floor() -> None:
            for name in names:
                with open(root / name, "rb") as f:
                    f.read().decode("utf-8")

        real_root = os.path.realpath(root)

        def safe_floor() -> None:
            # the least a sandboxed read must do: resolve, check containment, read
            for name in names:
                real = os.path.realpath(os.path.join(real_root, name))
                assert os.path.commonpath((real_root, real)) == real_root
                with open(real, "rb") as f:
                    f.read().decode("utf-8")

        def envelope() -> str:
            calls = tuple(ToolCall("read_file", {"path": n}, uuid.uuid4().hex) for n in names)
            return serialize(Plan(calls))

        best_floor = best_safe = best_one = best_many = float("inf")
        with executer:
            for _ in range(repeat):
                start = time.perf_counter()
                floor()
                best_floor = min(best_floor, time.perf_counter() - start)

                start = time.perf_counter()
                safe_floor()
                best_safe = min(best_safe, time.perf_counter() - start)

                text = envelope()
                start = time.perf_counter()
                results = executer.execute_sync(text, root)
                best_one = min(best_one, time.perf_counter() - start)
                assert all(r["result"]["success"] for r in results)

                singles = [
                    serialize(Plan((ToolCall("read_file", {"path": n}, uuid.uuid4().hex),)))
                    for n in names
                ]

                async def each(batch: list[str] = singles) -> None:
                    for one in batch:
                        await executer.execute(one, root)

                start = time.perf_counter()
                asyncio.run(each())
                best_many = min(best_many, time.perf_counter() - start)

    per_call = (best_one - best_floor) / count * 1e6
    ratio = best_one / best_floor
    ratio_many = best_many / best_floor
    ratio_safe = best_one / best_safe
    print(
        f"executer {count} read_file: one envelope {best_one * 1e3:.1f} ms "
        f"({best_one / count * 1e6:.0f} us/call, +{per_call:.0f} us over open()); "
        f"{count} envelopes {best_many * 1e3:.1f} ms; open() floor {best_floor * 1e3:.1f} ms; "
        f"ratio {ratio:.1f}x (one envelope), {ratio_many:.1f}x (one per call); "
        f"vs realpath+open() {best_safe * 1e3:.1f} ms: {ratio_safe:.1f}x"
    )
    return {
        "floor_s": best_floor,
        "envelope_s": best_one,
        "separate_s": best_many,
        "overhead_us": per_call,
        "ratio": ratio,
        "ratio_separate": ratio_many,
        "safe_floor_s": best_safe,
        "ratio_safe": ratio_safe,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    run(a.count, a.repeat)


if __name__ == "__main__":
    main()
