"""The data check's core on constructed statistics (the same DatasetFeatureStatisticsLists ingest
writes, one per split, built from records' signatures), each anomaly at and past its threshold."""
import pytest

from beam_jobs.statistics import statistics
from components.contracts.config import DataCheckConfig
from components.contracts.results import Anomaly, LabelConflict
from components.datacheck.check import decide, profile

CONFIG = DataCheckConfig()


def stats(mix: dict[str, int], split="train", size=(32, 32), sizes=None):
    """A span's statistics: `mix` records per class, all in `split`, all `size` (or one size each)."""
    records = [{"split": split, "label": name, "format": "png", "bytes": 100, "mean": 100.0, "std": 20.0,
                "uri": f"/{name}/{i}.png"} for name, count in mix.items() for i in range(count)]
    for i, record in enumerate(records):
        record["width"], record["height"] = (sizes[i] if sizes else size)
    return profile(statistics(records, [], sorted(mix)))


def kinds(verdict, severity=None):
    return [a.kind for a in verdict.anomalies if severity in (None, a.severity)]


def test_profile_reads_the_label_counts_and_sizes_ingest_writes():
    p = stats({"a": 3, "b": 1}, sizes=[(10, 20), (30, 40), (50, 60), (70, 80)])
    assert p.label_counts() == {"a": 3, "b": 1} and p.label_counts("eval") == {}
    assert p.ranges == {"image/width": (10, 70), "image/height": (20, 80)}


def test_first_span_runs_only_the_span_internal_checks():
    verdict = decide(1, stats({"a": 40, "b": 2}, size=(999, 999)), [], CONFIG, classes=["a", "b"])
    assert verdict.label_drift is None
    assert kinds(verdict) == ["rare_class"]  # b has 2 < 5; no drift, no sizes without history


@pytest.mark.parametrize("moved, expected", [(0, []), (12, []), (13, ["warning"]), (25, ["warning"]), (26, ["error"])])
def test_label_drift_is_the_largest_change_of_a_class_share(moved, expected):
    history = [stats({"a": 50, "b": 50})]
    new = stats({"a": 50 + moved, "b": 50 - moved})  # a's share moves by moved/100
    verdict = decide(2, new, history, CONFIG, classes=["a", "b"])
    assert verdict.label_drift == pytest.approx(moved / 100)
    assert [a.severity for a in verdict.anomalies if a.kind == "label_drift"] == expected


def test_a_new_class_counts_as_drift_by_its_share():
    verdict = decide(2, stats({"a": 10, "c": 30}), [stats({"a": 40})], CONFIG, classes=["a", "c"])
    assert verdict.label_drift == pytest.approx(0.75)
    drift = [a for a in verdict.errors if a.kind == "label_drift"]
    assert drift and "'a'" in drift[0].message and drift[0].count == 10
    assert verdict.history_label_counts == {"a": 40} and verdict.label_counts == {"a": 10, "c": 30}


def test_label_conflicts_from_the_manifest_are_errors_with_their_examples():
    conflict = LabelConflict(uri="s/cat/x.png", label="cat", duplicate_of="s/dog/x.png", other_label="dog",
                             other_span=1)
    found = [Anomaly(kind="label_conflict", count=30, examples=[conflict] * 20)]
    verdict = decide(2, stats({"a": 10}), [], CONFIG, classes=["a"], conflicts=found)
    (error,) = verdict.errors
    assert (error.kind, error.count, len(error.examples)) == ("label_conflict", 30, 5)
    assert "s/dog/x.png" in error.message


@pytest.mark.parametrize("same, expected", [(1, []), (20, []), (21, ["same_image_flood"])])
def test_more_than_the_share_of_records_under_one_dhash_is_a_flood(same, expected):
    hashes = {"ff00ff00ff00ff00": [f"s/a/{i}.png" for i in range(same)]}
    hashes.update({f"{i:016x}": [f"s/b/{i}.png"] for i in range(100 - same)})  # 100 records, same of them alike
    verdict = decide(1, stats({"a": 100}), [], CONFIG, classes=["a"], dhashes=hashes)
    assert kinds(verdict, "error") == expected
    if expected:
        assert verdict.errors[0].count == 21 and len(verdict.errors[0].examples) == 5


def test_a_single_record_is_no_flood():
    verdict = decide(1, stats({"a": 1}), [], DataCheckConfig(min_class_examples=0), classes=["a"],
                     dhashes={"00": ["s/a/0.png"]})
    assert verdict.anomalies == []


def test_sizes_outside_the_history_warn_with_a_count():
    history = [stats({"a": 20}, size=(32, 32)), stats({"a": 20}, size=(40, 30))]
    inside = decide(3, stats({"a": 20}, size=(36, 31)), history, CONFIG, classes=["a"])
    assert "image_size" not in kinds(inside)
    sizes = [(32, 32)] * 18 + [(640, 32)] * 2
    outside = decide(3, stats({"a": 20}, sizes=sizes), history, CONFIG, classes=["a"])
    (warning,) = [a for a in outside.anomalies if a.kind == "image_size"]
    assert warning.severity == "warning" and warning.count == 2 and "width" in warning.message
    assert outside.errors == []


@pytest.mark.parametrize("train, expected", [(4, ["b"]), (5, [])])
def test_a_class_with_too_few_training_records_in_span_and_history_warns(train, expected):
    history = [stats({"a": 50, "b": train - 2})]
    new = decide(2, stats({"a": 50, "b": 2}), history, DataCheckConfig(max_label_drift=1.0),
                 classes=["a", "b", "c"])
    rare = [a for a in new.anomalies if a.kind == "rare_class"]
    assert [a.message.split("'")[1] for a in rare] == expected + ["c"]  # c: known label, no records
    assert all(a.severity == "warning" for a in rare)


def test_eval_records_do_not_count_as_training_records():
    verdict = decide(1, stats({"a": 10}, split="eval"), [], CONFIG, classes=["a"])
    assert [(a.kind, a.count) for a in verdict.anomalies] == [("rare_class", 0)]


def test_label_counts_are_exact_past_the_20_top_values_and_1000_ranks():
    mix = {f"class-{i:04d}": 1 + i % 3 for i in range(1200)}
    assert stats(mix).label_counts() == mix
