"""The label check's core on fixed probabilities: confident learning as cleanlab computes it (and where
Stoke departs from it, for a class no record is labelled with), the expected rate, and the exact binomial
test that tells a few suspected label errors (warnings, each file named) from far too many (an error);
and the inputs it cannot judge, which skip it."""
import dataclasses

import hypothesis
import numpy as np
import pytest
from cleanlab.filter import find_label_issues
from hypothesis import strategies as st

from components.contracts.label_check import LabelCheck
from components.datacheck.label_errors import MIN_RATE, Predictions, expected_rate, judge, rate_test, suspects, thresholds

# Twelve records of three classes, four each; record 2 (labelled 0) and record 7 (labelled 1) are what
# the model confidently calls 1 and 2; record 10 (labelled 2, p = 0.6 for class 0) is below t_0 = 0.625.
GIVEN = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
PROBABILITIES = np.array([[.9, .05, .05], [.8, .1, .1], [.1, .85, .05], [.7, .2, .1],
                          [.1, .8, .1], [.05, .9, .05], [.2, .7, .1], [.05, .05, .9],
                          [.1, .1, .8], [.05, .15, .8], [.6, .2, .2], [.1, .1, .8]])


def test_with_every_class_labelled_it_is_cleanlabs_find_label_issues():
    assert thresholds(GIVEN, PROBABILITIES).tolist() == pytest.approx([0.625, 0.6125, 0.65])
    plain = find_label_issues(GIVEN, PROBABILITIES, n_jobs=1)
    assert np.flatnonzero(suspects(GIVEN, PROBABILITIES)).tolist() == np.flatnonzero(plain).tolist() == [2, 7]


def test_a_span_sorted_wholesale_into_one_class_is_caught_where_plain_cleanlab_sees_nothing():
    given = np.zeros(10, dtype=int)  # every image in folder 0, and every one of them a 1
    probabilities = np.tile([0.05, 0.9, 0.05], (10, 1))
    assert find_label_issues(given, probabilities, n_jobs=1).sum() == 0  # t_1 unreachable: nothing labelled 1
    assert suspects(given, probabilities).sum() == 9  # cleanlab keeps one record per given class
    assert suspects(given[:1], probabilities[:1]).sum() == 0  # one record: nothing to learn a threshold from


def test_the_expected_rate_is_the_historys_else_the_models_eval_error_never_below_the_floor():
    history = [LabelCheck(status="done", checked=100, flagged=6), LabelCheck(status="done", checked=300, flagged=18),
               LabelCheck(status="skipped", reason="no served model")]
    assert expected_rate(history, model_error=0.5) == (0.06, "the history's: 24 of 400 records flagged")
    assert expected_rate(history[2:], model_error=0.08)[0] == 0.08
    rate, where = expected_rate([LabelCheck(status="done", checked=100, flagged=1)], model_error=0.5)
    assert rate == MIN_RATE and where.startswith("the floor, above the history's") and "(1.0%)" in where
    assert expected_rate([], None)[0] == MIN_RATE


@pytest.mark.parametrize("flagged, error", [(5, False), (6, True)])
def test_flags_crowded_in_one_class_are_tested_on_that_class(flagged, error):
    given = np.repeat([0, 1, 2], 20)
    flags = np.zeros(60, dtype=bool)
    flags[:flagged] = True  # all in class 'a'
    p, tested = rate_test(flags, given, ["a", "b", "c"], MIN_RATE)
    assert bool(p < 1e-3) is error and tested == f"{flagged} of 20 records of class 'a'"


@pytest.mark.parametrize("flagged, error", [(8, False), (9, True)])
def test_flags_spread_over_the_classes_are_tested_on_the_span(flagged, error):
    given = np.repeat([0, 1, 2], 20)
    flags = np.zeros(60, dtype=bool)
    flags[[0, 20, 40, 1, 21, 41, 2, 22, 42][:flagged]] = True  # three a class at most
    p, tested = rate_test(flags, given, ["a", "b", "c"], MIN_RATE)
    assert bool(p < 1e-3) is error and tested == f"{flagged} of 60 records of the span"


def predictions(given, probabilities) -> Predictions:
    return Predictions(labels=["cat", "dog", "owl"], files=[f"s/{i}.jpg" for i in range(len(given))],
                       splits=["train"] * len(given), given=np.asarray(given), probabilities=np.asarray(probabilities),
                       unknown=2)


def test_a_few_suspects_are_warnings_naming_each_file_with_its_facts():
    findings, check = judge(predictions(GIVEN, PROBABILITIES), [], model_error=0.1, model="m/stoke/7")
    span, *files = findings
    assert (span.kind, span.severity, span.file, span.count) == ("label_error", "warning", None, 2)
    assert "2 of 12 records (17%) look mislabelled" in span.message and "within chance of the expected 10.0%" in span.message
    assert [(f.file, f.severity, f.label.given, f.label.predicted, f.label.confidence) for f in files] == [
        ("s/7.jpg", "warning", "dog", "owl", 0.9), ("s/2.jpg", "warning", "cat", "dog", 0.85)]
    assert files[1].label.given_probability == 0.1 and files[1].label.split == "train"
    assert (check.status, check.model, check.checked, check.unknown, check.flagged) == ("done", "m/stoke/7", 12, 2, 2)
    assert [(p.given, p.predicted, p.count) for p in check.pairs] == [("dog", "owl", 1), ("cat", "dog", 1)]
    assert check.expected_rate == 0.1 and check.p_value == 1.0  # 2 of 12 at 10%: Bonferroni caps it


def test_a_class_relabelled_wholesale_is_an_error_about_the_span():
    given = np.repeat([0, 1, 2], 20)
    probabilities = np.tile([0.02, 0.02, 0.02], (60, 1))
    probabilities[np.arange(60), given] = 0.96
    probabilities[:20] = [0.02, 0.96, 0.02]  # every 'cat' is a dog
    findings, check = judge(predictions(given, probabilities), [], model_error=0.0, model="m/stoke/7")
    span, *files = findings
    assert span.severity == "error" and len(files) == check.flagged == 19 and {f.severity for f in files} == {"error"}
    assert "far above the expected 3.0%" in span.message and "19 'cat' -> 'dog'" in span.message
    assert check.p_value < 1e-3 and [(p.given, p.predicted, p.count) for p in check.pairs] == [("cat", "dog", 19)]


def test_a_clean_span_has_no_finding_and_says_what_it_judged():
    given = np.repeat([0, 1, 2], 5)
    probabilities = np.full((15, 3), 0.05)
    probabilities[np.arange(15), given] = 0.9
    assert judge(predictions(given, probabilities), [], None, "m/stoke/7") == (
        [], LabelCheck(status="done", model="m/stoke/7", checked=15, unknown=2, flagged=0, expected_rate=MIN_RATE,
                       expected_from="the floor, above nothing to go by (0.0%)"))


def test_a_class_that_arrives_wholly_in_another_folder_is_an_error_about_the_span():
    """Every owl in the dog folder (as every "three" arriving in the "eight" folder): no record is labelled
    owl, so t_owl is the absent class's 0.5, and half the dog folder is confidently owls."""
    given = np.repeat([0, 1, 1], 20)  # 20 cats; 20 dogs and 20 owls, all in the dog folder
    probabilities = np.tile([0.02, 0.02, 0.02], (60, 1))
    probabilities[np.arange(60), np.repeat([0, 1, 2], 20)] = 0.96
    findings, check = judge(predictions(given, probabilities), [], model_error=0.0, model="m/stoke/7")
    span, *files = findings
    assert span.severity == "error" and {f.label.given for f in files} == {"dog"}
    assert [(p.given, p.predicted, p.count) for p in check.pairs] == [("dog", "owl", 20)]
    assert "far above the expected 3.0%" in span.message and "20 'dog' -> 'owl'" in span.message


@pytest.mark.parametrize("label", [0, 1, 2])
def test_a_night_of_one_class_is_judged_whichever_class_it_is(label):
    """A night of one line or one camera: 21 records of one class, which cleanlab refuses unless it is class
    0. Sorted into its own folder nothing is flagged; sorted wholesale into another, all but one are."""
    given = np.full(21, label)
    right = np.full((21, 3), 0.05)
    right[:, label] = 0.9
    findings, check = judge(predictions(given, right), [], model_error=0.1, model="m/stoke/7")
    assert findings == [] and (check.status, check.checked, check.unknown, check.flagged) == ("done", 21, 2, 0)
    other = (label + 1) % 3
    wrong = np.full((21, 3), 0.05)
    wrong[:, other] = 0.9
    findings, check = judge(predictions(given, wrong), [], model_error=0.1, model="m/stoke/7")
    span, *files = findings
    assert span.severity == "error" and check.flagged == len(files) == 20
    assert [(p.given, p.predicted) for p in check.pairs] == [(["cat", "dog", "owl"][label], ["cat", "dog", "owl"][other])]
    assert suspects(given[:1], wrong[:1]).sum() == 0  # one record: nothing to learn a threshold from


def test_one_known_class_beside_records_the_model_does_not_know_is_judged_on_the_known_one():
    """A known class and a new one: the new one's records are not judged (`unknown`)."""
    records = dataclasses.replace(predictions([1] * 12, np.tile([0.05, 0.9, 0.05], (12, 1))), unknown=9)
    findings, check = judge(records, [], None, "m/stoke/7")
    assert findings == [] and (check.status, check.checked, check.unknown) == ("done", 12, 9)


def test_a_span_of_no_class_the_model_knows_skips_the_label_check_and_says_why():
    records = predictions(np.zeros(0, dtype=int), np.zeros((0, 3)))
    findings, check = judge(dataclasses.replace(records, unknown=21), [], 0.1, "m/stoke/7")
    assert findings == [] and (check.status, check.model, check.unknown, check.flagged) == ("skipped", "m/stoke/7", 21, 0)
    assert check.reason == ("none of the span's records is of a class the served model answers (21 of classes it does "
                            "not know, or that it could not read): the other checks judge the span")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.5])
def test_answers_that_are_no_probabilities_skip_the_label_check(bad):
    """A served model whose weights went to NaN answers NaN: nothing it says is evidence."""
    probabilities = PROBABILITIES.copy()
    probabilities[3] = [bad, 0.5, 0.5]
    findings, check = judge(predictions(GIVEN, probabilities), [], 0.1, "m/stoke/7")
    assert findings == [] and (check.status, check.checked, check.flagged) == ("skipped", 0, 0)
    assert check.reason.startswith("the served model's answers on 1 of 12 records are not probabilities")
    assert check.reason.endswith("the other checks judge the span")
    zero = PROBABILITIES.copy()
    zero[0] = 0.0  # no class at all: nothing to normalise
    assert judge(predictions(GIVEN, zero), [], 0.1, "m/stoke/7")[1].status == "skipped"


def test_a_class_of_one_record_and_a_model_that_answers_one_class_are_judged():
    """The other small cases have an answer: cleanlab never flags the only record of a class (nothing to
    estimate its threshold from), and a model that calls every record a cat contradicts every dog and owl
    folder, which is what a folder sorted into another looks like."""
    given = np.array([0] * 10 + [1])
    probabilities = np.tile([0.9, 0.05, 0.05], (11, 1))
    findings, check = judge(predictions(given, probabilities), [], 0.0, "m/stoke/7")
    assert findings == [] and (check.status, check.checked, check.flagged) == ("done", 11, 0)

    given = np.repeat([0, 1, 2], 20)
    findings, check = judge(predictions(given, np.tile([0.98, 0.01, 0.01], (60, 1))), [], 0.0, "m/stoke/7")
    span, *files = findings
    assert check.status == "done" and span.severity == "error" and {f.label.predicted for f in files} == {"cat"}
    assert {f.label.given for f in files} == {"dog", "owl"}


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(data=st.data(), classes=st.integers(1, 4), records=st.integers(0, 24))
def test_any_predictions_are_judged_or_skipped_never_a_crash(data, classes, records):
    """Whatever the served model answers and however few records or classes the span holds."""
    given = np.array(data.draw(st.lists(st.integers(0, classes - 1), min_size=records, max_size=records)), dtype=int)
    row = st.lists(st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0, 1)), min_size=classes, max_size=classes)
    probabilities = np.array(data.draw(st.lists(row, min_size=records, max_size=records)), dtype=float)
    found = Predictions(labels=[f"c{j}" for j in range(classes)], files=[f"s/{i}.jpg" for i in range(records)],
                        splits=["train"] * records, given=given, probabilities=probabilities.reshape(records, classes))
    findings, check = judge(found, [], data.draw(st.sampled_from([None, 0.0, 0.2])), "m/stoke/7")
    if check.status == "skipped":
        assert check.reason and findings == []
    else:
        assert check.checked == records
        assert check.flagged == len([f for f in findings if f.file]) <= records
