"""The report files of a run (`parity.json`, `summary.md`, `junit.xml`, failure files), the report directory,
`merge` of shard reports, the merge `gate`, provenance. Imports the engine's outcome model, never a front end.
"""
