"""The pytest plugin as another repository sees it (loaded through the installed `pytest11` entry point,
no conftest): options, parametrization, the gpu marker, a shrunk failure."""

from tests.plugin_runs import assert_outcomes, runpytest

pytest_plugins = ["pytester"]

TEST_FILE = '''
import pytest

def test_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering, max_examples=3)
    assert rep.passed == rep.cases - rep.unsupported

@pytest.mark.gpu
def test_needs_gpu():
    pass
'''


def test_plugin_parametrizes_selected_lowerings_and_skips_gpu_tests(pytester):
    pytester.makepyfile(test_other_repo=TEST_FILE)
    res = runpytest(pytester, "--lowering", "sdpa", "--lowering", "decode_rows",
                                        "--parity-profile", "ci", "--parity-device", "cpu", "-rs", "-p", "no:cacheprovider")
    assert_outcomes(res, passed=2, skipped=1)
    res.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA GPU; torch sees none on this machine*"])


def test_plugin_reports_a_shrunk_failure(pytester):
    import pathlib
    plugin = pathlib.Path(__file__).resolve().parents[2] / "examples" / "plugin_window_off_by_one.py"
    pytester.makepyfile(test_other_repo=TEST_FILE.replace("max_examples=3", "max_examples=60"))
    res = runpytest(pytester, "--plugin", str(plugin), "--lowering",
                                        "my_windowed_merge", "--parity-profile", "ci", "--parity-device", "cpu",
                                        "-k", "test_parity", "-p", "no:cacheprovider")
    assert_outcomes(res, failed=1)
    res.stdout.fnmatch_lines(["*my_windowed_merge failed parity on cpu*", "*shrunk case: B=1*", "*case JSON*"])


def test_plugin_fails_a_lowering_whose_hook_fails_before_its_cases(pytester):
    """A hook asked while the cases are planned (here `dispatch_boundaries`, for the boundary cases) that
    raises fails that lowering's test with the hook named, and the session goes on (no internal error)."""
    plugin = pytester.path / "bad_hook.py"
    plugin.write_text("from lowerings import register\nfrom lowerings.torch_emulation import Sdpa\n\n\n"
                      "class P(Sdpa):\n    name = 'bad_hook'\n\n    def dispatch_boundaries(self):\n"
                      "        raise KeyError('threshold')\n\n\nregister(P())\n")
    pytester.makepyfile(test_other_repo=TEST_FILE)
    res = runpytest(pytester, "--plugin", str(plugin), "--lowering", "bad_hook", "--lowering", "sdpa",
                    "--parity-profile", "ci", "--parity-device", "cpu", "-k", "test_parity", "-p", "no:cacheprovider")
    assert_outcomes(res, failed=1, passed=1)
    res.stdout.fnmatch_lines(["*bad_hook failed parity on cpu: dispatch_boundaries() raised KeyError: 'threshold'*"])


def test_parity_limit_narrows_the_draw_and_names_a_bad_value(pytester):
    pytester.makepyfile(test_other_repo='''
def test_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering, max_examples=5)
    assert set(rep.drawn["head_dim"]) == {"64"}, rep.drawn
''')
    res = runpytest(pytester, "--lowering", "sdpa", "--parity-profile", "ci", "--parity-device", "cpu",
                    "--parity-limit", "head_dims=64", "-p", "no:cacheprovider")
    assert_outcomes(res, passed=1)
    bad = runpytest(pytester, "--lowering", "sdpa", "--parity-device", "cpu", "--parity-limit", "head_dim=64",
                    "-p", "no:cacheprovider")
    assert bad.ret == 4 and "--parity-limit: expected FIELD=VALUE" in bad.stderr.str(), bad.stderr.str()
