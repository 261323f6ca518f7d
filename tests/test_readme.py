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


def test_readme_is_a_guide_and_links_its_findings():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 400, "the README is the user's guide: findings go to docs/findings/"
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (REPO / link).exists(), f"README links {link}, which does not exist"
    for doc in ("docs/reference.md", "docs/findings/real-model.md", "docs/findings/embedded-world.md"):
        assert f"]({doc})" in text, doc


def test_every_function_the_module_map_names_exists():
    import importlib

    text = (REPO / "README.md").read_text()
    table = text[text.index("## Where each formula is computed"):]
    table = table[:table.index("\n## ")]
    names = re.findall(r"`(graft\.\w+\.\w+)`", table)
    assert len(names) >= 15, names
    missing = []
    for name in names:
        module, attr = name.rsplit(".", 1)
        if not callable(getattr(importlib.import_module(module), attr, None)):
            missing.append(name)
    assert not missing, missing
