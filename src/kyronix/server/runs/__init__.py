"""Runs: admitted in one transaction, executed outside any request, settled with their answer.

The wiring is :class:`kyronix.server.runs.service.Runs`; each step of a run is a module of this
package (its docstring has the table). Re-exported here: the request and handle types, and the
session-log keys a run writes.
"""

from kyronix.server.runs.handle import RunHandle, RunRequest
from kyronix.server.sessions import RESULT_KEY, RESULTS_KEY

__all__ = ["RESULTS_KEY", "RESULT_KEY", "RunHandle", "RunRequest"]
