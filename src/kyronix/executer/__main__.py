"""``python -m kyronix.executer PLAN.kml --base DIR``: the same as ``kyronix exec``."""

from kyronix.cli import exec_command

if __name__ == "__main__":
    exec_command(prog_name="python -m kyronix.executer")
