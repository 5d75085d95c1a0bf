"""The house rules of the code, checked on its imports: arrows point one way (flows -> stages and
beam_jobs -> common -> contracts), stages never import each other, and only flows know Prefect. Modules
are split where a reader would split them, not at a line count."""
import ast
import importlib.util
import pathlib
import sys

import pytest

from components.contracts import stages
from flows.cli import TOOLS

REPO = pathlib.Path(__file__).resolve().parents[1]
BELOW_STAGES = ("contracts", "common")


def package(stage: stages.Stage) -> str | None:
    """A stage's package under components/ (`train`), or None for a program elsewhere (beam_jobs)."""
    parts = stage.program.split(".")
    return parts[1] if parts[0] == "components" else None


def stage_packages() -> tuple[str, ...]:
    """The packages under components/ that the stage registry names."""
    return tuple(package(s) for s in stages.STAGES if package(s))


def imports(folder: str) -> dict[str, set[str]]:
    """Module name -> every module it imports (also inside functions), for the .py files under folder."""
    found = {}
    for path in (REPO / folder).rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
        found[module] = names
    return found


def owner(name: str) -> str | None:
    """The part of Stoke a module belongs to: 'contracts', 'common', a stage's package, 'beam_jobs',
    'flows' or 'benchmarks'; a package under components/ that the registry does not know is its own
    part, named 'unregistered:<name>', so no import goes unchecked."""
    parts = name.split(".")
    if parts[0] == "components" and len(parts) > 1:
        if parts[1] in (*BELOW_STAGES, *stage_packages()):
            return parts[1]
        return f"unregistered:{parts[1]}" if (REPO / "components" / parts[1]).is_dir() else None
    return parts[0] if parts[0] in ("beam_jobs", "flows", "benchmarks") else None


def uses() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for folder in ("components", "beam_jobs", "flows"):
        for module, names in imports(folder).items():
            source = owner(module)
            if source:
                graph.setdefault(source, set()).update(o for o in map(owner, names) if o and o != source)
    return graph


def test_contracts_import_nothing_of_stoke():
    # Names and models only: what reads or writes a file (the spans under ROOT, results) is in common.
    names = set().union(*imports("components/contracts").values())
    assert {n for n in names if owner(n) not in (None, "contracts")} == set()


def test_common_and_beam_jobs_stand_on_contracts_only():
    graph = uses()
    assert graph.get("common", set()) <= {"contracts"}
    assert graph["beam_jobs"] <= {"contracts", "common"}


def test_stages_are_siblings():
    graph = uses()
    for package in stage_packages():
        assert graph.get(package, set()) <= set(BELOW_STAGES), package


@pytest.mark.parametrize("folder", ["components", "beam_jobs"])
def test_only_flows_know_prefect(folder):
    offenders = [m for m, names in imports(folder).items() if any(n.split(".")[0] == "prefect" for n in names)]
    assert offenders == []


@pytest.mark.parametrize("folder", ["components", "beam_jobs", "flows", "benchmarks", "examples"])
def test_nothing_but_tests_imports_tests(folder):
    # A benchmark, like the product, stands on product code: what it shares with a test lives in the product.
    offenders = [m for m, names in imports(folder).items() if any(n.split(".")[0] == "tests" for n in names)]
    assert offenders == []


def test_no_benchmark_is_named_as_a_module_of_pythons_own():
    # `python benchmarks/X.py` puts benchmarks/ first on the path: a benchmarks/statistics.py stood in for the
    # standard library's statistics in every benchmark run that way, and photos.py failed at its summary.
    assert sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem in sys.stdlib_module_names) == []


def tool_packages() -> set[str]:
    """Packages under components/ that are whole commands of their own but no stage (the report)."""
    return {module.split(".")[1] for module, _ in TOOLS.values() if module.startswith("components.")
            and module.count(".") == 1}


def test_every_package_under_components_is_a_registered_stage_program():
    packages = {p.name for p in (REPO / "components").iterdir() if (p / "__init__.py").exists()}
    unknown = packages - set(BELOW_STAGES) - tool_packages()
    assert unknown == set(stage_packages()), "register the stage in components/contracts/stages.py"
    for s in stages.STAGES:
        assert importlib.util.find_spec(s.program) is not None, s.program
        if package(s):
            assert (REPO / "components" / package(s) / "__main__.py").exists(), s.name


def test_an_unregistered_package_is_its_own_part_and_fails_the_sibling_rule(monkeypatch):
    monkeypatch.setattr(stages, "STAGES", tuple(s for s in stages.STAGES if s.name != "push"))
    assert owner("components.push.push") == "unregistered:push"
    with pytest.raises(AssertionError):
        test_every_package_under_components_is_a_registered_stage_program()
