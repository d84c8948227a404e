"""Failure-file names made from lowering names: `parity.engine.file_names` (part of the outcome model: a report
entry names its failure files); its public names re-exported here for the report modules.

Public: `lowering_stem`, `failure_filename`, `stem_files`, `check_distinct`, `MAX_PLAIN`.
"""

from parity.engine.file_names import MAX_PLAIN, check_distinct, failure_filename, lowering_stem, stem_files  # noqa: F401
