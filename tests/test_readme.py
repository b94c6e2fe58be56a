"""The README's usage example is executed, and its two fresh-machine commands are the real ones."""
import doctest
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
CI_SCRIPT = README.parent / ".ci" / "run"


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_usage_example_runs_as_written():
    (example,) = _blocks("pycon")
    parser = doctest.DocTestParser()
    test = parser.get_doctest(example, {}, "README", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted >= 5 and failed == 0


def test_fresh_machine_commands_match_ci():
    install_run, install_test = _blocks("bash")[:2]
    assert "pip install ." in install_run and "mpt " in install_run
    assert "pip install '.[test]'" in install_test
    test_command = install_test.strip().split("&& ")[-1]
    assert test_command in CI_SCRIPT.read_text(), f"{test_command!r} is not what .ci/run runs"
