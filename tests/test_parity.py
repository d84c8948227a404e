"""The parity checks as pytest tests, parametrized by lowering through the plugin's `parity_lowering`.

Each correct built-in lowering that can run here must pass the profile's sweep (ci: 60 derandomized
cases; CPU lowerings on small shapes, Triton ones under the interpreter). Lowerings that cannot run
on this machine skip with the reason (`-rs` shows it).
"""


def test_lowering_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering)
    assert rep.cases > 0
