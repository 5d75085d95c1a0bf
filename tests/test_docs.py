"""The docs say what the code does: every setting of the run configuration is in the reference, and
the README stays a quickstart. (`make test` also builds the docs with mkdocs --strict: a broken link fails.)"""
import pathlib

from components.common.config_files import leaves
from components.contracts.run_config import RunConfig

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_setting_of_the_run_configuration_is_in_the_reference():
    """Each group's settings are rows of the table under its heading (`### train`: `train.epochs`),
    the run-wide ones under `### Run-wide`."""
    reference = (REPO / "docs" / "configuration.md").read_text()
    sections = {part.split("\n", 1)[0].strip(): part for part in reference.split("\n### ")[1:]}
    missing = [".".join(path) for path, _ in leaves(RunConfig)
               if f"| `{'.'.join(path)}` |" not in sections.get(path[0] if len(path) > 1 else "Run-wide", "")]
    assert missing == [], f"add these settings to docs/configuration.md: {missing}"


def test_the_readme_is_a_quickstart():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_every_stoke_environment_variable_is_in_the_reference():
    """Every `STOKE_` variable the code or infra/ reads is a row of the Environment table in
    docs/configuration.md, and every row there is one the code still reads."""
    import re

    name = re.compile(r"\bSTOKE_[A-Z0-9_]+\b")
    files = [path for folder in ("components", "flows", "beam_jobs", "benchmarks") for path in (REPO / folder).rglob("*.py")]
    files += [path for path in (REPO / "infra").rglob("*") if path.is_file()] + [REPO / "Makefile"]
    used = {found for path in files for found in name.findall(path.read_text())}
    reference = (REPO / "docs" / "configuration.md").read_text()
    table = reference.split("\n### Environment\n", 1)[1].split("\n### ", 1)[0]
    rows = {found for line in table.splitlines() if line.startswith("| `") for found in name.findall(line.split(" | ")[0])}
    assert used - rows == set(), f"add these to the Environment table of docs/configuration.md: {sorted(used - rows)}"
    assert rows - used == set(), f"nothing reads these any more: {sorted(rows - used)}"


# The code map is the section "## The code" of docs/layout.md. It names each module by its path from the
# repository's root in backticks (`components/train/trainer.py`), whatever the text around it, so a module
# is found by that alone (a bare `trainer.py` names no file of the repository, so the map refuses it). It covers
# every module of these folders; a package's `__init__.py` and `__main__.py` go without saying (the package is
# named by its folder, its program is `python -m` the package). benchmarks/ and tests/ are outside it: the
# benchmarks are docs/benchmarks.md's, and the tests mirror the folders above.
MAPPED = ("components", "beam_jobs", "flows", "examples")
UNMAPPED = ("__init__.py", "__main__.py")


def code_map() -> set[str]:
    import re

    layout = (REPO / "docs" / "layout.md").read_text()
    section = layout.split("\n## The code\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([\w./-]+\.py)`", section))


def test_the_code_map_names_every_module():
    modules = {path.relative_to(REPO).as_posix() for folder in MAPPED for path in (REPO / folder).rglob("*.py")
               if path.name not in UNMAPPED}
    assert sorted(modules - code_map()) == [], "add these to the code map in docs/layout.md, each with its job"


def test_the_code_map_names_only_modules_that_exist():
    assert sorted(name for name in code_map() if not (REPO / name).is_file()) == [], \
        "these are not modules of the repository: correct or remove them in docs/layout.md's code map"
