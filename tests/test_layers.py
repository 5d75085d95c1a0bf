"""The house rules of the code, checked on its imports: arrows point one way, contracts import no
other part of Stoke, stages use each other without cycles, and only flows know Prefect."""
import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
STAGES = ("preflight", "train", "validate", "push", "report")


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
    """The part of Stoke a module belongs to: 'contracts', a stage, 'beam_jobs', 'flows' or 'benchmarks'."""
    parts = name.split(".")
    if parts[0] == "components" and len(parts) > 1 and parts[1] in ("contracts", *STAGES):
        return parts[1]
    return parts[0] if parts[0] in ("beam_jobs", "flows", "benchmarks") else None


def uses() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for folder in ("components", "beam_jobs", "flows"):
        for module, names in imports(folder).items():
            source = owner(module)
            if source:
                graph.setdefault(source, set()).update(o for o in map(owner, names) if o and o != source)
    return graph


def test_contracts_import_nothing_of_stoke_and_beam_jobs_only_contracts():
    graph = uses()
    assert graph.get("contracts", set()) == set()
    assert graph["beam_jobs"] <= {"contracts"}


def test_stages_use_each_other_one_way_and_never_the_flows():
    graph = uses()
    for stage in STAGES:
        assert not graph.get(stage, set()) & {"flows", "beam_jobs", "benchmarks"}, stage

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in graph.get(start, ()))

    cycles = [stage for stage in STAGES if reaches(stage, stage)]
    assert cycles == [], f"stages that reach themselves: {cycles}; graph: {graph}"


@pytest.mark.parametrize("folder", ["components", "beam_jobs"])
def test_only_flows_know_prefect(folder):
    offenders = [m for m, names in imports(folder).items() if any(n.split(".")[0] == "prefect" for n in names)]
    assert offenders == []


def test_every_stage_is_a_program():
    for stage in STAGES:
        assert (REPO / "components" / stage / "__main__.py").exists(), stage
