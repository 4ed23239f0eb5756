"""The `agent` command: its verbs (`main`, `ops`, `wait`) and logging set-up (`logs`). Top layer:
may import any agent package; nothing imports it.
"""

from agent.cli.main import main

__all__ = ["main"]
