"""The nights of a simulated year, drawn from a seed: what arrives, what breaks, what a person does.

A schedule is a function of the seed alone: the year's own draws (where SOURCE is and what secret it
carries, how ROOT is spelled, a class held back to arrive later as a new one, a class whose feed dies)
come from `default_rng([seed])`, and night N's from `default_rng([seed, N])`, so night 7 of seed 3 is
the same night however many nights the year has; SOURCE's secret and ROOT's spelling go round with the seed,
so that a few seeds hold them all. What a night draws is an intent ("release what is
held", "kill the stage that is running after 2 s"); the world applies it to the state it finds
(benchmarks/year_bucket.py, year_faults.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

ARRIVALS = ("all", "one", "none", "new_class", "skewed")
EXTRAS = ("near_copies", "reuploads", "broken", "odd", "relabelled", "rewritten", "deleted")
# Faults while the night's run runs (`at` names the stage they wait for) and hand edits before it.
RUN_FAULTS = ("kill_run", "kill_stage", "disk_full", "store_errors", "two_runs", "rollback", "prune",
              "shard_replaced")
HAND_EDITS = ("span_deleted", "span_edited", "version_removed", "version_truncated", "mirror_edited",
              "candidate_linked", "commands_edited", "foreign_version")
FAULTS = RUN_FAULTS + HAND_EDITS
ACTS = ("release", "rollback", "resume", "free_disk")
STAGES = ("ingest", "datacheck", "train", "gate", "push", "report")
BROKEN = ("truncated", "text", "empty", "huge_header")
ODD = ("cmyk", "sixteen_bit", "alpha", "palette", "space_name", "unicode_name")
EDITS = ("manifest", "check_record", "shard_bytes")
# Secrets SOURCE may carry: a password in the user info (plain; starting with digits and a `;`; with quotes,
# a space, `@` and `:`), or a manifest's query signature (a name every scrubber knows; `hmac`).
SECRETS = ("none", "password", "digits_password", "odd_password", "amz_signature", "hmac_query")
ROOT_NAMES = ("root", "the root", "röot ü", "exp[1]root")


@dataclasses.dataclass(frozen=True)
class Event:
    kind: str  # one of ARRIVALS, EXTRAS, FAULTS or ACTS
    params: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}({inner})" if inner else self.kind


@dataclasses.dataclass(frozen=True)
class Night:
    number: int
    arrivals: Event
    extras: tuple[Event, ...]
    fault: Event | None
    acts: tuple[Event, ...]  # the next morning, after the night's checks

    def events(self) -> list[Event]:
        return [self.arrivals, *self.extras, *([self.fault] if self.fault else []), *self.acts]

    def __str__(self) -> str:
        return "; ".join(map(str, self.events()))


@dataclasses.dataclass(frozen=True)
class Year:
    seed: int
    secret: str  # one of SECRETS: "none" reads SOURCE as a local folder
    root_name: str  # ROOT's folder name, as a user may spell it
    withheld: str | None  # a class that arrives only from a `new_class` night on
    vanishing: tuple[str, int] | None  # a class whose feed dies from that night on
    nights: tuple[Night, ...]


def draw(seed: int, nights: int, without: frozenset[str] = frozenset()) -> Year:
    """The year of `seed`, `nights` long; events of the kinds `without` names are drawn, then left out (an
    arrival becomes `none`), to look past a failure known already."""
    rng = np.random.default_rng([seed])
    secret, root_name = SECRETS[seed % len(SECRETS)], ROOT_NAMES[seed % len(ROOT_NAMES)]  # each within a few seeds
    withheld = str(rng.choice(NAMES)) if rng.random() < 0.6 else None
    vanishing = None
    if rng.random() < 0.5:
        vanishing = (str(rng.choice([n for n in NAMES if n != withheld])), int(rng.integers(2, 12)))
    return Year(seed, secret, root_name, withheld, vanishing,
                tuple(_leave_out(draw_night(seed, number), without) for number in range(1, nights + 1)))


def _leave_out(night: Night, without: frozenset[str]) -> Night:
    if not without:
        return night
    return Night(night.number, Event("none") if night.arrivals.kind in without else night.arrivals,
                 tuple(e for e in night.extras if e.kind not in without),
                 None if night.fault is not None and night.fault.kind in without else night.fault,
                 tuple(e for e in night.acts if e.kind not in without))


def draw_night(seed: int, number: int) -> Night:
    rng = np.random.default_rng([seed, number])
    if number == 1:  # the first delivery: every class the year starts with, enough to train on
        return Night(1, Event("all", {"per_class": 25}), (), None, ())
    kind = str(rng.choice(ARRIVALS, p=[0.45, 0.1, 0.15, 0.1, 0.2]))
    params = {"all": lambda: {"per_class": int(rng.integers(2, 7))},
              "one": lambda: {"count": int(rng.integers(8, 20))},
              "none": dict,
              "new_class": lambda: {"count": int(rng.integers(8, 16)), "with_others": bool(rng.random() < 0.5)},
              "skewed": lambda: {"classes": int(rng.integers(2, 4)), "count": int(rng.integers(15, 35))}}[kind]()
    arrivals = Event(kind, params)
    extras = []
    for extra, chance in zip(EXTRAS, (0.15, 0.15, 0.12, 0.15, 0.06, 0.12, 0.1)):
        if rng.random() < chance:
            extras.append(Event(extra, _extra_params(extra, rng)))
    fault = _fault(rng) if rng.random() < 0.5 else None
    acts = []
    if rng.random() < 0.7:  # held spans: let in now, in a few nights, or never
        acts.append(Event("release", {"when": str(rng.choice(["now", "later", "never"], p=[0.5, 0.25, 0.25]))}))
    if rng.random() < 0.08:
        acts.append(Event("rollback"))
    if rng.random() < 0.5:  # a run killed this night is run again with its id
        acts.append(Event("resume"))
    if rng.random() < 0.8:  # a full disk is cleared; else it stays full another night
        acts.append(Event("free_disk"))
    return Night(number, arrivals, tuple(extras), fault, tuple(acts))


def _extra_params(extra: str, rng) -> dict:
    if extra == "broken":
        return {"files": sorted(set(str(k) for k in rng.choice(BROKEN, int(rng.integers(1, 3)))))}
    if extra == "odd":
        return {"files": sorted(set(str(k) for k in rng.choice(ODD, int(rng.integers(1, 4)))))}
    if extra == "relabelled":
        a, b = rng.choice(NAMES, 2, replace=False)
        return {"from": str(a), "to": str(b), "count": int(rng.integers(8, 16))}
    return {"count": int(rng.integers(2, 8))}


def _fault(rng) -> Event:
    kind = str(rng.choice(FAULTS))
    # a point in a stage: its program seen, then up to 12 s (a training here lasts 10 to 40 s)
    at = {"stage": str(rng.choice(STAGES)), "after": round(float(rng.uniform(0, 12)), 1)}
    if kind in ("kill_run", "disk_full", "rollback", "prune"):
        return Event(kind, at)
    if kind == "kill_stage":
        return Event(kind, {**at, "stage": str(rng.choice(STAGES[:5]))})
    if kind == "store_errors":
        return Event(kind, {"after": at["after"], "seconds": round(float(rng.uniform(1, 20)), 1),
                            "share": round(float(rng.uniform(0.2, 1.0)), 2)})
    if kind == "two_runs":
        return Event(kind, {"apart": round(float(rng.uniform(0, 5)), 1)})
    if kind == "shard_replaced":
        return Event(kind, {"stage": "train", "after": at["after"]})
    if kind == "span_edited":
        return Event(kind, {"edit": str(rng.choice(EDITS))})
    return Event(kind)


def kinds(year: Year) -> set[str]:
    """Every event kind the year draws, and its secret and ROOT spelling as `secret:...`, `root:...`."""
    found = {event.kind for night in year.nights for event in night.events()}
    return found | {f"secret:{year.secret}", f"root:{year.root_name}"} | (
        {"vanishing"} if year.vanishing else set()) | ({"withheld"} if year.withheld else set())
