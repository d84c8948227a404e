"""The front end's name for `parity.report.intake` (what a user hands over, refused before anything is
allocated): the report layer reads reports back with it too, so it lives there.

Public: `read_json`, `read_case_file`, `case_bytes`, `check_case_fits`, `MAX_JSON_BYTES`, `MAX_CASE_BYTES`.
"""

from parity.report.intake import (MAX_CASE_BYTES, MAX_JSON_BYTES, case_bytes, check_case_fits,  # noqa: F401
                                  read_case_file, read_json)
