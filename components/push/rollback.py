"""`python -m components.push.rollback --root ROOT [--reason TEXT]`: takes the newest version out of serving.

The version folder is renamed to `rolled-back-<version>` (never deleted), so TF Serving, which
only loads integer names, falls back to the previous version; the reason and time go into the
version's lineage, and ROOT/serving is rendered again without it, all under the repository's
lock (Repository.lock()). The newest version is the one TF Serving serves: what the server would
take for a version and Stoke does not is set aside first (Repository.tidy()). The only version is
never removed: a server with nothing to serve is worse than the model it had.
"""
from __future__ import annotations

import sys

from components.common import clock, program
from components.common.files import join, write_json
from components.common.repository import ASSETS_EXTRA, LINEAGE_FILE, ROLLED_BACK_PREFIX, Repository, RepositoryError
from components.contracts.layout import Root
from components.contracts.lineage import RolledBack
from components.push.serving_image import ServingError, render


def rollback(root: str, model_name: str = "stoke", reason: str | None = None) -> dict:
    base = Root(root)
    repo = Repository(base, model_name)
    with repo.lock("rollback"):
        tidied = repo.tidy()
        versions = repo.versions()
        if not versions:
            raise RepositoryError(f"{repo.uri} holds no version to roll back")
        if len(versions) == 1:
            raise RepositoryError(f"version {versions[0]} is the only version of {model_name}; "
                                  "refusing to leave TF Serving with nothing to serve")
        newest = versions[-1]
        when = clock.now()
        aside = repo.take_out(newest)
        rolled_back = RolledBack(at=when, reason=reason or "no reason given", moved_to=aside, serving_now=versions[-2])
        lineage = repo.lineage(newest)
        if lineage is None:  # a version Stoke did not push: record the rollback alone
            write_json(join(aside, ASSETS_EXTRA, LINEAGE_FILE),
                       {"model_name": model_name, "version": newest, "rolled_back": rolled_back.to_json()})
        else:
            write_json(join(aside, ASSETS_EXTRA, LINEAGE_FILE), lineage.model_copy(update={"rolled_back": rolled_back}).to_json())
        rendered = render(base, model_name)
    return {"rolled_back": newest, "moved_to": aside, "serving_version": versions[-2], "reason": reason,
            "at": when, "versions": rendered["versions"], "serving_uri": rendered["serving_uri"],
            "commands": rendered["commands"], "model_name": model_name,
            "set_aside": [aside.to_json() for aside in tidied.set_aside]}


def run(argv: list[str] | None = None) -> int:
    parser = program.arguments("stoke rollback", __doc__)
    parser.add_argument("--root", required=True, help="artifact ROOT: local path or fsspec URI")
    parser.add_argument("--model-name", default="stoke", help="model in ROOT/models (default: stoke)")
    parser.add_argument("--reason", default=None, help="why, recorded in the version's lineage")
    args = parser.parse_args(argv)

    def describe(summary: dict) -> str:
        return (f"rolled back version {summary['rolled_back']} of {args.model_name} (kept as "
                f"{ROLLED_BACK_PREFIX}{summary['rolled_back']}); serving version {summary['serving_version']}")

    return program.main("stoke rollback", args.json, lambda: rollback(args.root, args.model_name, args.reason),
                        describe, errors=(RepositoryError, ServingError, OSError))


if __name__ == "__main__":
    sys.exit(run())
