"""The one exception type for invalid input to the oracle, the case model and the framework."""

from __future__ import annotations


class InvalidInput(ValueError):
    """Bad input a user can fix: names the argument (or case field) and the rule it broke.

    `where` is the argument, field or file at fault; `rule` says what was expected. The CLI prints
    ``str(err)`` and exits 2, with no traceback.
    """

    def __init__(self, where: str, rule: str):
        self.where = where
        self.rule = rule
        super().__init__(f"{where}: {rule}")
