"""Benchmark: KML parse throughput of a ~1 MB plan against ElementTree on equivalent XML.

The KML plan holds raw content (unescaped ``<`` and ``&``) the way models write it; the XML
document carries the same arguments escaped, so ``xml.etree.ElementTree.fromstring`` accepts it.
The ratio is KML time over ElementTree time (C expat); lower is better.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

from kyronix.kml import parse

LINE = 'if (a < b && c > 0) { x = "<div>" + y; }  // some code\n'


def documents(size: int) -> tuple[str, str]:
    """A KML plan and an equivalent well-formed XML document of about ``size`` characters."""
    content = LINE * 80
    kml, xml = (
        ["<kyronix>\n<plan>Write the files.</plan>\n"],
        ["<kyronix>\n<plan>Write the files.</plan>\n"],
    )
    i = total = 0
    while total < size:
        name, eid = "write_file", f"id-{i}"
        kml.append(
            f'<tool name="{name}" executionId="{eid}">\n<path>src/f{i}.ts</path>\n'
            f"<content>\n{content}</content>\n</tool>\n"
        )
        xml.append(
            f"<tool name={quoteattr(name)} executionId={quoteattr(eid)}>\n"
            f"<path>src/f{i}.ts</path>\n<content>\n{escape(content)}</content>\n</tool>\n"
        )
        total += len(kml[-1])
        i += 1
    kml.append("<status>complete</status>\n</kyronix>\n")
    xml.append("<status>complete</status>\n</kyronix>\n")
    return "".join(kml), "".join(xml)


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(size: int = 1_000_000, repeat: int = 5) -> dict[str, float]:
    kml, xml = documents(size)
    tools = len(parse(kml).tools)
    assert tools == len(ElementTree.fromstring(xml).findall("tool"))
    t_kml = _best(lambda: parse(kml), repeat)
    t_xml = _best(lambda: ElementTree.fromstring(xml), repeat)
    mb_kml, mb_xml = len(kml) / t_kml / 1e6, len(xml) / t_xml / 1e6
    ratio = t_kml / t_xml
    print(
        f"kml      {len(kml) / 1e6:.2f} MB, {tools} tools: parse {t_kml * 1e3:.1f} ms "
        f"({mb_kml:.0f} MB/s); ElementTree {t_xml * 1e3:.1f} ms ({mb_xml:.0f} MB/s) on "
        f"{len(xml) / 1e6:.2f} MB escaped XML; ratio {ratio:.2f}x"
    )
    return {"kml_s": t_kml, "xml_s": t_xml, "kml_mb_s": mb_kml, "xml_mb_s": mb_xml, "ratio": ratio}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=1_000_000, help="plan size in characters")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    run(a.size, a.repeat)


if __name__ == "__main__":
    main()
