"""The data check's core on constructed statistics (the same DatasetFeatureStatisticsLists ingest
writes, one per split, built from records' signatures), each anomaly at and past its threshold; the class
mix judged as arrivals come: a skewed arrival warns, a new label or a class gone for good quarantines."""
import math
from fractions import Fraction

import pytest

from beam_jobs.statistics import statistics
from components.contracts.config import DataCheckConfig
from components.contracts.results import Anomaly, LabelConflict, SamePicture
from components.contracts.summaries import DataAnomaly, DataCheckRecord
from components.datacheck.check import decide, profile
from components.datacheck.mix import log10_absence, released_gone

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
    verdict = decide(1, stats({"a": 40, "b": 2}, size=(999, 999)), {}, CONFIG, classes=["a", "b"])
    assert verdict.label_drift is None
    assert kinds(verdict) == ["rare_class"]  # b has 2 < 5; no drift, no sizes without history


@pytest.mark.parametrize("moved, expected", [(0, []), (12, []), (13, ["warning"]), (26, ["warning"]), (50, ["warning"])])
def test_label_drift_is_the_largest_change_of_a_class_share_and_only_warns(moved, expected):
    history = {1: stats({"a": 50, "b": 50})}
    new = stats({"a": 50 + moved, "b": 50 - moved})  # a's share moves by moved/100; at 50, b is gone
    verdict = decide(2, new, history, CONFIG, classes=["a", "b"])
    assert verdict.label_drift == pytest.approx(moved / 100)
    assert [a.severity for a in verdict.anomalies if a.kind == "label_drift"] == expected
    assert [a.kind for a in verdict.errors] == []  # a change of mix alone never quarantines


TEXTURES = ["brick", "grass", "gravel"]


def test_an_arrival_of_two_of_three_classes_warns_with_its_figures_and_trains():
    """120 textures of brick and grass, none of gravel, after 120 of all three."""
    verdict = decide(2, stats({"brick": 60, "grass": 60}), {1: stats({"brick": 40, "grass": 40, "gravel": 40})},
                     CONFIG, classes=TEXTURES)
    assert verdict.errors == [] and verdict.label_drift == pytest.approx(1 / 3)
    drift, = [a for a in verdict.anomalies if a.kind == "label_drift"]
    assert drift.severity == "warning" and drift.count == 120
    assert "shifted by 0.33 (L-infinity, over 0.125) in span 2's 120 records against the history's 120" in drift.message
    assert ("more 'brick' (60 where 40 expected, 50% against 33%), 'grass' (60 where 40 expected, 50% against 33%); "
            "fewer 'gravel' (0 where 40 expected, 0% against 33%); no earlier arrival to compare with") in drift.message
    absent, = [a for a in verdict.anomalies if a.kind == "absent_class"]
    assert (absent.severity, absent.class_name, absent.count) == ("warning", "gravel", 120)
    assert "40 expected; chance of none, (1 - p)^n: 7e-22): a skewed arrival, trained on" in absent.message
    assert "missing from 1 arrival in a row (spans 2), 3 in a row quarantine" in absent.message


def test_a_shift_is_read_against_the_shifts_of_the_earlier_arrivals():
    history = {1: stats({"a": 50, "b": 50}), 2: stats({"a": 90, "b": 10}), 3: stats({"a": 60, "b": 40})}
    # Earlier arrivals against their own history: span 2 against 1 drifted 0.40, span 3 against 1-2 0.10.
    within = decide(4, stats({"a": 90, "b": 10}), history, CONFIG, classes=["a", "b"])
    assert "1 of the 2 earlier arrivals shifted as far or further against their own history: within what " \
           "arrivals show" in within.anomalies[0].message
    beyond = decide(4, stats({"a": 0, "b": 100}), history, CONFIG, classes=["a", "b"])
    assert "further than any of the 2 earlier arrivals against their own history (at most 0.40)" in \
           [a for a in beyond.anomalies if a.kind == "label_drift"][0].message
    assert beyond.errors == []  # b is known, a had records before: a shift, however far, warns


def test_a_label_no_span_let_in_had_is_an_error_with_its_count_examples_and_release():
    uris = [f"s/sand/{i}.png" for i in range(7)]
    verdict = decide(3, stats({"brick": 40, "grass": 40, "sand": 7}), {1: stats({"brick": 40, "grass": 40})}, CONFIG,
                     classes=["brick", "grass", "sand"], examples={"sand": uris, "brick": ["s/brick/0.png"]})
    error, = verdict.errors
    assert (error.kind, error.class_name, error.count, error.examples) == ("new_label", "sand", 7, uris[:5])
    assert "label 'sand' is new: 7 of span 3's 87 records carry it and no span let in so far has one" in error.message
    assert "`stoke spans release 3 --root ROOT`" in error.message
    # A label a span let in has (a release of it included) is known from then on, whatever its share.
    known = decide(4, stats({"sand": 30}), {1: stats({"brick": 40, "grass": 40}), 3: stats({"sand": 7})}, CONFIG,
                   classes=["brick", "grass", "sand"])
    assert "new_label" not in kinds(known) and known.errors == [] and "label_drift" in kinds(known, "warning")


def test_the_first_span_has_no_new_labels():
    assert decide(1, stats({"a": 10, "b": 10}), {}, CONFIG, classes=["a", "b"]).errors == []


@pytest.mark.parametrize("share, records, expected", [
    (Fraction(1, 3), 120, Fraction(2, 3) ** 120),  # ~7.4e-22: gravel in a night of brick and grass
    (Fraction(1, 2), 10, Fraction(1, 1024)),  # 0.00098: beyond chance at 0.001
    (Fraction(1, 2), 9, Fraction(1, 512)),  # 0.0020: within chance
    (Fraction(1, 10), 66, Fraction(9, 10) ** 66),  # 0.00096
])
def test_the_chance_of_an_arrival_without_a_class_is_the_binomial_chance_of_none(share, records, expected):
    assert 10 ** log10_absence(float(share), records) == pytest.approx(float(expected), rel=1e-9)
    assert log10_absence(1.0, 5) == -math.inf and log10_absence(1 / 3, 10_000) == pytest.approx(-1760.9, abs=0.1)


HISTORY = stats({"brick": 40, "grass": 40, "gravel": 40})
SKEWED = stats({"brick": 60, "grass": 60})


def arrivals(*mixes) -> dict:
    """Span 1 holds every class; spans 2.. are the mixes given."""
    return {1: HISTORY} | {n: mix for n, mix in enumerate(mixes, start=2)}


@pytest.mark.parametrize("before, expected", [((), "absent_class"), ((SKEWED,), "absent_class"),
                                              ((SKEWED, SKEWED), "vanished_class")])
def test_a_class_missing_from_three_arrivals_in_a_row_has_stopped_arriving(before, expected):
    history = arrivals(*before)
    verdict = decide(len(history) + 1, SKEWED, history, CONFIG, classes=TEXTURES)
    (found,) = [a for a in verdict.anomalies if a.class_name == "gravel"]
    assert found.kind == expected and found.severity == ("error" if expected == "vanished_class" else "warning")
    if expected == "vanished_class":
        assert found.count == 360 and verdict.errors == [found]
        # gravel is 40 of the history's 360 records (the skewed ones count): 40 expected in the three arrivals,
        # (8/9)^120 = 7e-07 each, 3.6e-19 together.
        assert ("none in the last 3 arrivals (spans 2, 3, 4: 360 records, 11% of the history's 360, so 40 expected; "
                "chance of none, (1 - p)^n: 7e-07, 7e-07, 7e-07, each under 0.001, together 4e-19)") in found.message
        assert "`stoke spans release 4 --root ROOT`" in found.message


def test_one_skewed_night_quarantines_only_when_vanished_after_is_one():
    verdict = decide(2, SKEWED, arrivals(), DataCheckConfig(vanished_after=1), classes=TEXTURES)
    assert [(a.kind, a.class_name) for a in verdict.errors] == [("vanished_class", "gravel")]
    assert "none in span 2 (120 records" in verdict.errors[0].message


@pytest.mark.parametrize("small, breaks", [(10, False), (9, True)])
def test_an_arrival_too_small_to_have_shown_the_class_is_no_evidence(small, breaks):
    """At a share of a half, no gravel in 10 records is beyond chance (1/1024), in 9 it is not (1/512)."""
    history = {1: stats({"gravel": 100 + small}), 2: stats({"brick": 100}), 3: stats({"brick": small})}  # half gravel
    verdict = decide(4, stats({"brick": 100}), history, CONFIG, classes=["brick", "gravel"])
    (found,) = [a for a in verdict.anomalies if a.class_name == "gravel"]
    assert found.kind == ("absent_class" if breaks else "vanished_class")
    alone = decide(4, stats({"brick": small}), {1: stats({"brick": 100, "gravel": 100})}, CONFIG,
                   classes=["brick", "gravel"])
    assert [a.kind for a in alone.anomalies if a.class_name == "gravel"] == ([] if breaks else ["absent_class"])


def test_a_class_whose_absence_a_release_accepted_is_not_judged_again_until_it_returns():
    history = arrivals(SKEWED, SKEWED, SKEWED)  # span 4 was quarantined for gravel, then released
    gone = {4: {"gravel"}}
    accepted = decide(5, SKEWED, history, CONFIG, classes=TEXTURES, gone=gone)
    assert [a for a in accepted.anomalies if a.class_name == "gravel"] == [] and accepted.errors == []
    assert "vanished_class" in kinds(decide(5, SKEWED, history, CONFIG, classes=TEXTURES))  # without the release
    back = history | {5: HISTORY, 6: SKEWED, 7: SKEWED}  # gravel came back in span 5, and stopped again
    assert "vanished_class" in kinds(decide(8, SKEWED, back, CONFIG, classes=TEXTURES, gone=gone))


def test_released_gone_reads_the_vanished_classes_of_released_records():
    def record(span, status, *found):
        return DataCheckRecord(span=span, check_version=3, status=status, checked_at="x", reasons=[], anomalies=[
            DataAnomaly(kind=kind, severity="error", message="m", class_name=name) for kind, name in found])
    records = {2: record(2, "released", ("vanished_class", "gravel"), ("new_label", "sand")),
               3: record(3, "warning", ("absent_class", "grass")), 4: record(4, "released")}
    assert released_gone(records) == {2: {"gravel"}, 4: set()}


def test_label_conflicts_from_the_manifest_are_errors_with_their_examples():
    conflict = LabelConflict(uri="s/cat/x.png", label="cat", duplicate_of="s/dog/x.png", other_label="dog",
                             other_span=1)
    found = [Anomaly(kind="label_conflict", count=30, examples=[conflict] * 20)]
    verdict = decide(2, stats({"a": 10}), {}, CONFIG, classes=["a"], conflicts=found)
    (error,) = verdict.errors
    assert (error.kind, error.count, len(error.examples)) == ("label_conflict", 30, 5)
    assert "s/dog/x.png" in error.message


@pytest.mark.parametrize("count, total, expected", [(1, 1, []), (20, 100, []), (21, 100, ["same_image_flood"]),
                                                     (2, 3, ["same_image_flood"])])
def test_more_than_the_share_of_files_ingest_judged_one_picture_is_a_flood(count, total, expected):
    found = SamePicture(count=count, total=total, examples=[f"s/a/{i}.png" for i in range(min(count, 5))])
    alike = {"ff00ff00ff00ff00": [f"s/a/{i}.png" for i in range(100)]}  # one dHash: not what decides any more
    verdict = decide(1, stats({"a": 100}), {}, CONFIG, classes=["a"], same_picture=found, dhashes=alike)
    assert kinds(verdict, "error") == expected
    if expected:
        (flood,) = verdict.errors
        assert flood.count == count and flood.examples == found.examples
        assert flood.message.startswith(f"{count} of the span's {total} files (") and "one picture" in flood.message


@pytest.mark.parametrize("same, expected", [(1, []), (20, []), (21, ["same_image_flood"])])
def test_a_span_published_before_ingest_judged_pictures_is_judged_by_its_most_shared_dhash(same, expected):
    hashes = {"ff00ff00ff00ff00": [f"s/a/{i}.png" for i in range(same)]}
    hashes.update({f"{i:016x}": [f"s/b/{i}.png"] for i in range(100 - same)})  # 100 records, same of them alike
    verdict = decide(1, stats({"a": 100}), {}, CONFIG, classes=["a"], dhashes=hashes)
    assert kinds(verdict, "error") == expected
    if expected:
        assert verdict.errors[0].count == 21 and len(verdict.errors[0].examples) == 5
        assert "published before ingest told distinct frames alike at 9x8 apart" in verdict.errors[0].message


def test_a_single_record_is_no_flood():
    verdict = decide(1, stats({"a": 1}), {}, DataCheckConfig(min_class_examples=0), classes=["a"],
                     dhashes={"00": ["s/a/0.png"]})
    assert verdict.anomalies == []


def test_sizes_outside_the_history_warn_with_a_count():
    history = {1: stats({"a": 20}, size=(32, 32)), 2: stats({"a": 20}, size=(40, 30))}
    inside = decide(3, stats({"a": 20}, size=(36, 31)), history, CONFIG, classes=["a"])
    assert "image_size" not in kinds(inside)
    sizes = [(32, 32)] * 18 + [(640, 32)] * 2
    outside = decide(3, stats({"a": 20}, sizes=sizes), history, CONFIG, classes=["a"])
    (warning,) = [a for a in outside.anomalies if a.kind == "image_size"]
    assert warning.severity == "warning" and warning.count == 2 and "width" in warning.message
    assert outside.errors == []


@pytest.mark.parametrize("train, expected", [(4, ["b"]), (5, [])])
def test_a_class_with_too_few_training_records_in_span_and_history_warns(train, expected):
    history = {1: stats({"a": 50, "b": train - 2})}
    new = decide(2, stats({"a": 50, "b": 2}), history, DataCheckConfig(max_label_drift=1.0),
                 classes=["a", "b", "c"])
    rare = [a for a in new.anomalies if a.kind == "rare_class"]
    assert [a.message.split("'")[1] for a in rare] == expected + ["c"]  # c: known label, no records
    assert all(a.severity == "warning" for a in rare)


def test_eval_records_do_not_count_as_training_records():
    verdict = decide(1, stats({"a": 10}, split="eval"), {}, CONFIG, classes=["a"])
    assert [(a.kind, a.count) for a in verdict.anomalies] == [("rare_class", 0)]


def test_label_counts_are_exact_past_the_20_top_values_and_1000_ranks():
    mix = {f"class-{i:04d}": 1 + i % 3 for i in range(1200)}
    assert stats(mix).label_counts() == mix
