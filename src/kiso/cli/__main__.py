"""``python -m kiso.cli``: the ``kiso`` command (how ``delegate`` starts its children)."""

from kiso.cli import main

main()
