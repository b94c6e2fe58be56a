"""The README's usage example is executed, and its two fresh-machine commands are the real ones."""
import configparser
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


def _release(version: str) -> tuple:
    """A release number as a comparable tuple, trailing zeros dropped ("1.26.0" == "1.26")."""
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def test_oldest_constraints_pin_the_declared_floors():
    """constraints/oldest.txt pins every runtime and test dependency at the lowest version that
    setup.cfg allows, and the README shows the command that installs it."""
    cfg = configparser.ConfigParser()
    cfg.read(README.parent / "setup.cfg")
    declared = (cfg["options"]["install_requires"].split()
                + cfg["options.extras_require"]["test"].split())
    floors = dict(re.fullmatch(r"([\w-]+)>=([\d.]+)", d).groups() for d in declared)
    text = (README.parent / "constraints" / "oldest.txt").read_text()
    pins = dict(re.findall(r"^([\w-]+)==([\d.]+)", text, flags=re.M))
    for name, floor in floors.items():
        assert name in pins and _release(pins[name]) == _release(floor), (name, floor, pins)
    assert any("pip install -c constraints/oldest.txt '.[test]' && python -m pytest" in block
               for block in _blocks("bash"))
