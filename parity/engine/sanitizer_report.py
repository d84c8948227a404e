"""The stream sanitizer's report on a failing case, as the engine reads it.

A nondeterministic (or state-dependent, or unreproduced) failure on CUDA is replayed under PyTorch's CUDA stream
sanitizer by the sanitizer port (`parity.engine.ports.SanitizerReplay`; the process machinery's replay runs it in a
fresh process: `parity.exec.sanitizer`). The replay answers a text headed by one of `FOUND`, `NOTHING` or
`COULD_NOT`; a finding goes on with the races CSAN printed (`CSAN detected ...`, then for each access its stream,
the kernel's schema and what it read or wrote, each with its stack). The whole text goes into the failure file;
`summary_line` makes the one line attached to the failure's messages.

Public: `FOUND`, `NOTHING`, `COULD_NOT`, `SEES`, `summary_line`.
"""

from __future__ import annotations

FOUND = "stream sanitizer (torch.cuda._sanitizer) found an unsynchronized access replaying this case"
NOTHING = "stream sanitizer (torch.cuda._sanitizer) replayed this case and found no unsynchronized access"
COULD_NOT = "stream sanitizer (torch.cuda._sanitizer) could not replay this case"
SEES = ("it sees accesses through PyTorch only: a race inside one kernel, or on memory a library allocates "
        "itself, is not seen")


def summary_line(text: str) -> str:
    """One line for a failure's messages: the header, and for a finding the first race's tensor, and each
    access's stream, kernel and kind (the stacks stay in the failure file)."""
    head, _, body = text.partition(":\n")
    if not text.startswith(FOUND):
        return text.splitlines()[0] if text else COULD_NOT
    lines = [ln.strip() for ln in body.splitlines()]
    keep = [ln for ln in lines if ln.startswith("CSAN detected")][:1]
    for i, ln in enumerate(lines):
        if ln.startswith(("Access by stream", "Previous access by stream")):
            keep += [ln, *lines[i + 1:i + 3]]  # the kernel's schema, then "reading from ..." / "writing to ..."
        if len(keep) >= 7:
            break
    return f"{head}: " + "; ".join(keep)[:700] + " (stacks in the failure file)"
