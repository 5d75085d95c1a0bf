"""`python -m components.push --root ROOT --run-id ID`: the push of a blessed candidate.

Refuses a run without BLESSED, a run validated against a served version that is no longer the
newest (gate it again), and pushes a run at most once (a second push reports the first). It holds
the repository's lock from the first look at the repository to the rendered ROOT/serving, so
concurrent pushes take turns. It writes its intent (push_intent.json) before the version and
pushed.json after (the version's record, which makes a second push report the first), and its result,
push.json, last; a version whose lineage names the run counts as pushed, so a push stopped
between the two is finished by the next attempt instead of repeated. The
version folder gets the candidate, `assets.extra/tf_serving_warmup_requests` (the requests
validation replayed), `assets.extra/stoke_answers.json.gz` (the candidate's answers the gate recorded,
which later gates hold candidates to while it is their reference) and `assets.extra/stoke_lineage.json`,
which names that reference; it appears atomically
(components/common/repository.py). Then retention keeps the newest --keep versions and ROOT/serving
is rendered again; the image is built when a container engine answers. A retry of a push killed
after its version appeared finishes those two steps (retention only while its version is still
the newest) before it reports the version.
"""
from __future__ import annotations

import hashlib
import json
import subprocess

from components.common import clock, processes, program
from components.common.files import exists, filesystem, join, read_bytes, read_result, remove, write_json
from components.common.repository import (
    ANSWERS_FILE,
    ASSETS_EXTRA,
    LINEAGE_FILE,
    MODEL_CARD,
    MODEL_CARD_JSON,
    Repository,
    RepositoryError,
    kill_drill,
)
from components.common.store_errors import on_root
from components.contracts.layout import WARMUP_FILE, Root, RunDir
from components.contracts.lineage import Blessing, Lineage, LineageSpan, Pushed, PushIntent, Training
from components.contracts.results import GateReference, GateResult, ResultError, SpanManifest, TrainMetrics
from components.contracts.run_config import RunConfig
from components.contracts.secrets import recorded
from components.contracts.summaries import PushSummary
from components.push import model_card
from components.push.serving_image import ServingError


class PushError(Exception):
    """A refusal with a message for the user (no traceback)."""


def run(argv: list[str] | None = None) -> int:
    args = program.stage_arguments("push", argv)
    return program.main("stoke push", args.json, on_root(lambda config, facts: push(config, run_id=facts.run_id),
                                                         lambda: program.stage_config("push", args)),
                        program.lines_of(PushSummary), errors=(PushError, RepositoryError, ServingError, ResultError, OSError),
                        failed=PushSummary(pushed=False))


def push(config: RunConfig, *, run_id: str) -> PushSummary:
    from components.push import serving_image as serving

    root = Root(config.root)
    run = root.run(run_id)
    repo = Repository(root, config.model_name)
    if not exists(run.blessed):
        why = "it was not validated (run `stoke gate` first)"
        if exists(run.not_blessed):
            why = "validation refused it: " + "; ".join(read_result(run.gate, GateResult).reasons)
        raise PushError(f"run {run.run_id} is not blessed: {why}")
    validation = read_result(run.gate, GateResult)
    if validation.model_name != config.model_name:
        raise PushError(f"run {run.run_id} was validated for model {validation.model_name!r}, "
                        f"not {config.model_name!r}; gate it against {config.model_name!r} first")

    with repo.lock("push"):
        earlier = earlier_push(repo, run)
        summary = (_finish(config, root, run, repo, earlier) if earlier is not None
                   else _publish(config, root, run, repo, validation))
    summary.image = (serving.build_image(root.serving, config.model_name, summary.versions[-1], summary.serving_image)
                     if config.push.build_image else {"built": False, "reason": "not asked (push.build_image false)"})
    write_json(run.result("push"), summary.to_json())  # the run's record of the push, for its report
    return summary


def _finish(config: RunConfig, root: Root, run: RunDir, repo: Repository, earlier: Pushed) -> PushSummary:
    """A run pushed before: the steps after its version appeared are finished if a kill stopped them.
    Retention only while its version is the newest (a later push applied its own --keep); the
    serving context is rendered again, so what the push builds and prints is what Stoke writes, never
    what it finds there (it says what it changed: versions it did not hold, or held otherwise)."""
    from components.push import serving_image as serving

    retired = repo.apply_retention(config.push.keep, clock.now()) if repo.newest() == earlier.version else []
    rendered = serving.render(root, config.model_name)
    done = ([f"retired {retired}"] if retired else []) + (
        [f"rendered {rendered['serving_uri']}: {', '.join(rendered['changed'])}"] if rendered["changed"] else [])
    finished = f"; finished what it left undone: {', '.join(done)}" if done else "; nothing to do"
    return PushSummary(
        pushed=False, already_pushed=True, run_id=run.run_id, model_name=config.model_name,
        version=earlier.version, model_uri=earlier.model_uri, serving_uri=rendered["serving_uri"],
        serving_image=rendered["serving_image"],
        commands=rendered["commands"], versions=rendered["versions"], retired=retired,
        message=f"run {run.run_id} was already pushed as version {earlier.version} on {earlier.pushed_at}"
                + finished)


def _publish(config: RunConfig, root: Root, run: RunDir, repo: Repository, validation: GateResult) -> PushSummary:
    """The part of a push that changes the repository; the caller holds its lock."""
    from components.push import serving_image as serving

    tidied = repo.tidy()
    newest = repo.newest()
    if newest != validation.served_version:
        raise PushError(f"run {run.run_id} was validated while version {validation.served_version} "
                        f"was the newest served; now it is {newest}. Run `stoke gate` again")

    candidate = run.candidate
    trained_tf = serving.saved_model_tf_version(candidate)
    serving.server_for(trained_tf)  # before anything is written: a model no pinned server can serve is refused
    version = repo.next_version()
    # A run gated before the gate recorded answers has none: its version is nobody's reference.
    answers = read_bytes(run.answers) if exists(run.answers) else None
    lineage = build_lineage(root, run, config, validation, version, trained_tf, answers is not None)
    card = model_card.build(root, lineage, validation, read_result(run.metrics, TrainMetrics))
    warmup_fs, warmup_path = filesystem(run.warmup)
    intent = PushIntent(version=version, model_uri=repo.version_uri(version), started_at=lineage.pushed_at)
    write_json(run.push_intent, intent.to_json())
    model_uri = repo.publish(candidate, version, {
        f"{ASSETS_EXTRA}/{LINEAGE_FILE}": json.dumps(lineage.to_json(), indent=2, sort_keys=True).encode(),
        f"{ASSETS_EXTRA}/{WARMUP_FILE}": warmup_fs.cat_file(warmup_path),
        **({f"{ASSETS_EXTRA}/{ANSWERS_FILE}": answers} if answers is not None else {}),
        f"{ASSETS_EXTRA}/{MODEL_CARD_JSON}": json.dumps(card.to_json(), indent=2, sort_keys=True).encode(),
        f"{ASSETS_EXTRA}/{MODEL_CARD}": model_card.render_markdown(card).encode(),
    })
    kill_drill("published")
    write_json(run.pushed, Pushed(version=version, model_uri=model_uri, pushed_at=lineage.pushed_at).to_json())
    remove(run.push_intent)
    kill_drill("recorded")
    retired = repo.apply_retention(config.push.keep, clock.now())
    kill_drill("retired")
    rendered = serving.render(root, config.model_name)
    return PushSummary(
        pushed=True,
        run_id=run.run_id,
        model_name=config.model_name,
        version=version,
        model_uri=model_uri,
        model_card=join(model_uri, ASSETS_EXTRA, MODEL_CARD),
        previous_version=newest,
        versions=rendered["versions"],
        retired=retired,
        cleaned_partial=tidied.removed,
        set_aside=tidied.set_aside,
        serving_uri=rendered["serving_uri"],
        serving_image=rendered["serving_image"],
        trained_tensorflow=trained_tf,
        labels=rendered["labels"],
        commands=rendered["commands"],
        metrics=validation.metrics.model_dump(include={"accuracy", "top_k_accuracy", "example_count"}),
    )


def earlier_push(repo: Repository, run: RunDir) -> Pushed | None:
    """pushed.json, or else a complete version whose lineage names this run: a push that stopped after
    publishing and before recording it (pushed.json is then written for it). The intent's version is
    looked at first; it may also be retired by now."""
    if exists(run.pushed):
        return read_result(run.pushed, Pushed)
    complete = set(repo.versions() + repo.rolled_back() + repo.retired())
    intended = [read_result(run.push_intent, PushIntent).version] if exists(run.push_intent) else []
    for version, aside in ([(v, False) for v in intended if v in complete] + [(v, False) for v in repo.versions()[::-1]]
                           + [(v, True) for v in repo.rolled_back()[::-1]]):
        lineage = repo.lineage(version, rolled_back=aside)
        if lineage is not None and lineage.run_id == run.run_id:
            pushed = Pushed(version=version, model_uri=repo.version_uri(version), pushed_at=lineage.pushed_at)
            write_json(run.pushed, pushed.to_json())
            if exists(run.push_intent):
                remove(run.push_intent)
            return pushed
    return None


def build_lineage(root: Root, run: RunDir, config: RunConfig, validation: GateResult, version: int, trained_tf: str,
                  answered: bool) -> Lineage:
    """Served version -> run -> spans (with their manifests' hashes and counts) -> metrics, blessing, and the
    reference later candidates are held to (reference_after)."""
    from components.push import serving_image as serving

    trained = read_result(run.metrics, TrainMetrics)
    spans = []
    for number in trained.spans:
        manifest_uri = root.manifest(number)
        fs, path = filesystem(manifest_uri)
        raw = fs.cat_file(path)
        manifest = SpanManifest.check(json.loads(raw), manifest_uri)
        digest = hashlib.sha256(raw).hexdigest()
        if trained.span_manifests is not None and trained.span_manifests.get(number) != digest:
            raise PushError(f"span {number} changed since run {run.run_id} trained on it ({manifest_uri} is not the "
                            "manifest training read): the lineage would name records the model never saw; train again")
        spans.append(LineageSpan(span=manifest.span, manifest_uri=manifest_uri, manifest_sha256=digest,
                                 source=recorded(manifest.source),  # a span published before names kept it
                                 created=manifest.created, counts=manifest.counts, sources=len(manifest.sources)))
    return Lineage(
        model_name=config.model_name,
        version=version,
        pushed_at=clock.now(),
        run_id=run.run_id,
        run_uri=run.uri,
        labels=trained.labels,
        untrained=trained.untrained,
        spans=spans,
        training=Training.model_validate(trained.model_dump(include=set(Training.model_fields))),
        metrics=validation.metrics,
        blessing=Blessing.model_validate(validation.model_dump(include=set(Blessing.model_fields))),
        tensorflow_version=trained_tf,
        serving_image=serving.server_for(trained_tf),
        code_version=code_version(),
        reference=reference_after(validation.reference, version, answered),
        environment=trained.environment,
    )


def reference_after(held: GateReference | None, version: int, answered: bool) -> int | None:
    """The reference later candidates are held to class by class once `version` is pushed (components/gate/
    reference.py): the one the gate `held` a warm run to, else the version itself; none when its gate
    recorded no answers (not `answered`)."""
    if not answered:
        return None
    return held.version if held is not None and held.kept else version


def code_version() -> dict:
    """The stoke package version and, when the code runs from a git checkout, its commit."""
    from importlib import metadata
    from pathlib import Path

    info = {"package": None, "git_commit": None, "git_dirty": None}
    try:
        info["package"] = metadata.version("stoke")
    except metadata.PackageNotFoundError:
        pass
    here = Path(__file__).resolve().parent
    try:
        commit = processes.run(["git", "rev-parse", "HEAD"], cwd=here, timeout=10)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            status = processes.run(["git", "status", "--porcelain", "--", "components", "beam_jobs"],
                                   cwd=here.parent, timeout=10)
            info["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info
