"""Run every kernel benchmark: `python -m bench` (add --quick for a smoke run)."""

from __future__ import annotations

import argparse
import platform

from bench import (
    append,
    concurrency,
    executer,
    kml,
    load,
    replicas,
    runtime,
    sandbox,
    server,
    size,
    startup,
    tunnel,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    a = p.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.system()}")
    if a.quick:
        append.run(300, 1)
        load.run(3_000, 1)
        size.run(200, 50)
        runtime.run([50])
        startup.run(3)
        kml.run(100_000, 1)
        executer.run(100, 1)
        sandbox.run(10)
        concurrency.run(5, 3, repeat=1)
        server.run(40, 40, 4)
        tunnel.run(200)
        replicas.run(30, 40, 4, 1)
    else:
        append.run(10_000, 3)
        load.run(100_000, 5)
        size.run(1_000)
        runtime.run([200, 1_000, 2_000])
        startup.run(15)
        kml.run()
        executer.run()
        sandbox.run()
        concurrency.run(50, 20, repeat=3)
        server.run()
        tunnel.run()
        replicas.run()


if __name__ == "__main__":
    main()
