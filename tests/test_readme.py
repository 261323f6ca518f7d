import re

from tests.conftest import REPO


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, re.S)[:2]


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    main, tests = readme_commands()
    assert "dvc repro" in main and "setup.sh" in main
    assert "pytest" in tests and "setup.sh" in tests
    ci = (REPO / ".ci/run").read_text()
    assert tests.strip() in ci
