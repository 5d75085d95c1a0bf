"""The label check's core on fixed probabilities: confident learning as cleanlab computes it (and where
Stoke departs from it, for a class no record is labelled with), the expected rate, and the exact binomial
test that tells a few suspected label errors (warnings, each file named) from far too many (an error)."""
import numpy as np
import pytest
from cleanlab.filter import find_label_issues

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
