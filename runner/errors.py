"""The runner's usage error: a command line, workflow or binding that cannot run (exit 2, EXIT_USAGE)."""

from __future__ import annotations


class WorkflowError(ValueError):
    """The workflow cannot be converted or bound; the message says what to change."""
