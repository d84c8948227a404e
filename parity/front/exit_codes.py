"""The exit codes of `dflash-parity` (every verb), of a `check --jobs` child, and of the pytest plugin's session.

- `EXIT_OK` 0: all hold;
- `EXIT_FAIL` 1: a parity failure (or a gate failure), or `check` judged nothing (every lowering unavailable or
  every case unsupported; `--allow-nothing-judged` makes that 0), or plugin code exited the process;
- `EXIT_USAGE` 2: bad usage or bad input (one line naming the input, no traceback);
- `EXIT_INTERRUPTED` 130: interrupted by SIGINT; 128+n for signal n (143 SIGTERM, 129 SIGHUP:
  `parity.exec.interrupt.exit_code`): `check` first writes the report of the cases that ran, the interrupted
  lowering marked failed as a partial run.
"""

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C, `timeout -s INT`); 128+n for signal n
