"""An arrival's class mix against the history's, judged as arrivals come, without any I/O.

Real arrivals are rarely stratified: a night of one production line, one camera or one season brings
some classes and none of the others. Against the history's mix such a night is far beyond chance (no
gravel in 120 textures where the history holds a third of gravel: (2/3)^120 ~ 7e-22), so no test of one
span's counts tells it from a broken feed. What tells them apart is what a skewed night cannot be:

- a label no span let in has had (`new_labels`): an error; a new class changes the model's outputs and
  is let in by a person (`stoke spans release N`);
- a class of the history missing, each time beyond chance, from `vanished_after` arrivals in a row
  (`absent_classes`): an error, a feed that died; fewer in a row are skewed nights, warnings;
- a class relabelled: the label check's (label_errors.py), with the served model.

A change of mix alone (`label_drift`) is a warning with its figures, and the span trains: the classes
over- and under-represented with counts and shares, and where the shift stands among the shifts the
earlier arrivals showed against their own history, the empirical distribution of what this bucket's
arrivals do.

"For good" is a run, as the run rules of statistical process control tell a shift of the process from
one point out of line (Western Electric, Statistical Quality Control Handbook, 1956): one arrival without
a class is a skewed night, two can be a weekend of one line; `vanished_after` (3) in a row, each large
enough that the history's mix would have shown the class, is a feed that stopped. A dead feed then trains
two nights without its class (the history still holds it) before a person is asked.
"""
from __future__ import annotations

import math
from collections import Counter

from components.contracts.summaries import DataAnomaly, DataCheckRecord

EXAMPLES = 5  # URIs named per anomaly; the count covers them all
LISTED = 3  # classes named each way in a label-drift warning
# An arrival without a class "beyond chance": (1 - p)^n below this. Not corrected for the number of
# classes: it asks whether an arrival was large enough to have shown the class (a night of 5 records is
# no evidence either way); what quarantines is a run of `vanished_after` such arrivals, whose chance
# under the history's mix is below ALPHA ** vanished_after.
ALPHA = 1e-3


def linf(mine: Counter, theirs: Counter) -> float:
    """TFDV's drift measure for a categorical feature: the L-infinity distance of the class shares, the
    largest difference of any one class's share."""
    total, past = sum(mine.values()), sum(theirs.values())
    return max(abs(mine[name] / total - theirs[name] / past) for name in set(mine) | set(theirs))


def past_drifts(counts: dict[int, Counter]) -> list[float]:
    """Each history span's drift against the history spans before it: how far this bucket's arrivals
    move the mix, the distribution a new span's drift is read against."""
    drifts, before = [], Counter()
    for number in sorted(counts):
        if sum(before.values()) and sum(counts[number].values()):
            drifts.append(linf(counts[number], before))
        before.update(counts[number])
    return drifts


def label_drift(span: int, mine: Counter, theirs: Counter, limit: float,
                past: list[float]) -> tuple[float, list[DataAnomaly]]:
    """The drift, and over `limit` a warning: the classes over- and under-represented against what the
    history's shares expect of the span's records, and how many earlier arrivals shifted as far."""
    distance = linf(mine, theirs)
    if distance <= limit:
        return distance, []
    total, history = sum(mine.values()), sum(theirs.values())
    moved = sorted(((mine[c] / total - theirs[c] / history, c) for c in set(mine) | set(theirs)),
                   key=lambda item: (-abs(item[0]), item[1]))

    def named(word: str, sign: int) -> list[str]:
        found = [c for d, c in moved if d * sign > 0]
        text = ", ".join(f"{c!r} ({mine[c]} where {count_text(total * theirs[c] / history)} expected, "
                         f"{mine[c] / total:.0%} against {theirs[c] / history:.0%})" for c in found[:LISTED])
        return [f"{word} {text}" + (f" and {len(found) - LISTED} more" if len(found) > LISTED else "")] if found else []

    further = sum(d >= distance for d in past)
    among = ("no earlier arrival to compare with" if not past else
             f"{further} of the {len(past)} earlier arrivals shifted as far or further against their own history: "
             "within what arrivals show" if further else
             f"further than any of the {len(past)} earlier arrivals against their own history (at most {max(past):.2f})")
    return distance, [DataAnomaly(
        kind="label_drift", severity="warning", count=total,
        message=f"label mix shifted by {distance:.2f} (L-infinity, over {limit:g}) in span {span}'s {total} records "
                f"against the history's {history}: " + "; ".join(named("more", 1) + named("fewer", -1)) + f"; {among}. "
                "A change of mix alone only warns: the span trains")]


def new_labels(span: int, mine: Counter, theirs: Counter, examples: dict[str, list[str]]) -> list[DataAnomaly]:
    """An error per label the span's records carry and no span let in had: new classes change what the
    model answers, and one no person has seen may be a typo of a folder or a feed sending the wrong thing."""
    total = sum(mine.values())
    return [DataAnomaly(
        kind="new_label", severity="error", count=mine[name], class_name=name, examples=examples.get(name, [])[:EXAMPLES],
        message=f"label {name!r} is new: {mine[name]} of span {span}'s {total} records carry it and no span let in "
                f"so far has one. If the class is meant, let the span in with `stoke spans release {span} --root ROOT` "
                "(training then retrains on the new label set); if not, take its folder out of the source")
        for name in sorted(mine) if mine[name] and not theirs[name]]


def log10_absence(share: float, records: int) -> float:
    """log10 of the probability that `records` records drawn from a mix where a class has `share` hold
    none of it: the binomial probability of zero successes, (1 - share) ** records. In logarithms: a span
    of a few thousand records takes it below the smallest float."""
    return -math.inf if share >= 1 else records * math.log1p(-share) / math.log(10)


def absent_classes(span: int, mine: Counter, counts: dict[int, Counter], after: int,
                   gone: dict[int, set[str]]) -> list[DataAnomaly]:
    """Per class of the history the span lacks beyond chance: an error when the `after` newest arrivals
    up to this one (the spans let in before it, and it) all lacked it beyond chance, a warning otherwise.
    Were arrivals drawn from the history's mix they would be independent, and the chance of the run the
    product of theirs. The class's share is the whole history's, the arrivals without it included: lower
    than before it stopped, so the test leans towards training. A class whose absence a release accepted
    (`gone`: span -> the classes its release let go) and that has not arrived since is not judged again:
    a retired class would otherwise hold back every night."""
    theirs = sum(counts.values(), Counter())
    history, total = sum(theirs.values()), sum(mine.values())
    earlier = [n for n in sorted(counts, reverse=True) if n < span]
    beyond = math.log10(ALPHA)
    found = []
    for name in sorted(c for c in theirs if theirs[c] and not mine[c]):
        share = theirs[name] / history
        seen = next((n for n in earlier if counts[n][name]), 0)
        if log10_absence(share, total) >= beyond or any(name in gone.get(n, ()) for n in earlier if n > seen):
            continue
        run = [(span, total)]  # (span, its records), newest first
        for n in earlier:
            records = sum(counts[n].values())
            if len(run) == after or counts[n][name] or log10_absence(share, records) >= beyond:
                break
            run.append((n, records))
        run.reverse()
        spans, records = ", ".join(str(n) for n, _ in run), sum(r for _, r in run)
        if len(run) < after:
            found.append(DataAnomaly(
                kind="absent_class", severity="warning", count=total, class_name=name,
                message=f"class {name!r} is missing from span {span}'s {total} records ({share:.0%} of the history's "
                        f"{history}, so {count_text(share * total)} expected; chance of none, (1 - p)^n: "
                        f"{chance_text(log10_absence(share, total))}): a skewed arrival, trained on; missing from "
                        f"{len(run)} {'arrivals' if len(run) > 1 else 'arrival'} in a row (spans {spans}), {after} in a "
                        "row quarantine (datacheck.vanished_after)"))
            continue
        chances = [log10_absence(share, r) for _, r in run]
        where = f"none in the last {after} arrivals (spans {spans}: " if after > 1 else f"none in span {span} ("
        found.append(DataAnomaly(
            kind="vanished_class", severity="error", count=records, class_name=name,
            message=f"class {name!r} has stopped arriving: {where}{records} records, {share:.0%} of the history's "
                    f"{history}, so {count_text(share * records)} expected; chance of none, (1 - p)^n: "
                    f"{', '.join(map(chance_text, chances))}, each under {ALPHA:g}"
                    + (f", together {chance_text(sum(chances))}" if after > 1 else "") + "): a feed that died? Mend "
                    f"it; if the class is retired, let the span in with `stoke spans release {span} --root ROOT`: the "
                    "release accepts it gone, and later arrivals without it train"))
    return found


def released_gone(records: dict[int, DataCheckRecord]) -> dict[int, set[str]]:
    """Span -> the classes a person accepted as gone by releasing it: its vanished_class findings."""
    return {number: {a.class_name for a in record.anomalies if a.kind == "vanished_class"}
            for number, record in records.items() if record.status == "released"}


def count_text(expected: float) -> str:
    return f"{expected:.1f}" if expected < 10 else f"{expected:.0f}"


def chance_text(log10: float) -> str:
    return f"{10 ** log10:.1g}" if log10 > -300 else f"10^{log10:.0f}"
