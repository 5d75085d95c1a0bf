"""`python -m components.push.show_lineage --root ROOT [VERSION]`: where a served model came from.

Version -> run -> spans (manifest hashes, source counts) -> metrics and blessing, read from the
lineage files alone (in the version, in rolled-back-<version>, or in _retired/), so the answer
survives deleted runs and retired versions. Without VERSION: the newest served version.
"""
from __future__ import annotations

import argparse
import sys

from components.common import program
from components.common.model_folders import MAX_VERSION, version_number
from components.common.repository import Repository, RepositoryError
from components.contracts.results import Environment, ResultError


def lineage(root: str, model_name: str = "stoke", version: int | None = None) -> dict:
    repo = Repository(root, model_name)
    served = repo.versions()
    if version is None:
        if not served:
            raise RepositoryError(f"{repo.uri} serves no version yet")
        version = served[-1]
    record = repo.lineage(version)
    if record is None:
        known = sorted(set(served + repo.rolled_back() + repo.retired()))
        raise RepositoryError(f"no lineage for version {version} of {model_name}; known versions: {known or 'none'}")
    status = ("served" if version in served else "rolled back" if version in repo.rolled_back() else "retired")
    return {"status": status, "served_versions": served, **record.to_json()}


def render_text(record: dict) -> str:
    metrics = record.get("metrics", {})
    blessing = record.get("blessing", {})
    lines = [f"{record['model_name']} version {record['version']} ({record['status']}), pushed {record.get('pushed_at')}",
             f"  run {record.get('run_id')}  ({record.get('run_uri')})",
             f"  trained with TensorFlow {record.get('tensorflow_version')}; image {record.get('serving_image')}",
             f"  environment: {_environment(record.get('environment'))}",
             f"  accuracy {metrics.get('accuracy')}  top-{metrics.get('top_k')} {metrics.get('top_k_accuracy')}  "
             f"on {metrics.get('example_count')} eval records",
             f"  blessed: {blessing.get('blessed')} (baseline version {blessing.get('baseline_version')})"]
    if record.get("reference") is not None:
        lines.append(f"  reference: version {record['reference']} (later candidates are held to it class by class)")
    for span in record.get("spans", []):
        lines.append(f"  span {span['span']}: {span.get('counts')} from {span.get('source')} "
                     f"(manifest sha256 {span.get('manifest_sha256', '')[:12]})")
    if record.get("untrained"):
        lines.append(f"  never answers {', '.join(record['untrained'])}: no record of the spans it was trained on "
                     f"carries {'them' if len(record['untrained']) > 1 else 'it'}")
    if record.get("rolled_back"):
        lines.append(f"  rolled back {record['rolled_back']['at']}: {record['rolled_back']['reason']}")
    if record.get("retired_at"):
        lines.append(f"  retired {record['retired_at']}")
    return "\n".join(lines)


def _environment(recorded: dict | None) -> str:
    return Environment.model_validate(recorded).in_words() if recorded else "not recorded"


def _version(text: str) -> int:
    """A version as Stoke writes them: int() would also take '٣' or '０１' for 3 and 1."""
    number = version_number(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"{text!r} is no version number (ASCII digits, at most {MAX_VERSION})")
    return number


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke lineage", __doc__)
    parser.add_argument("version", nargs="?", type=_version, default=None, help="version (default: newest served)")
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--model-name", default="stoke", help="model in ROOT/models (default: stoke)")
    args = parser.parse_args(argv)
    return program.main("stoke lineage", args.json, lambda: lineage(args.root, args.model_name, args.version),
                        render_text, errors=(RepositoryError, ResultError))


if __name__ == "__main__":
    sys.exit(run())
