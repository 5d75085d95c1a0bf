"""The classes of a model: its label ids, 0 to its highest, named (a record stores a label's id, which is its
index in labels.json, so a model keeps every id below its highest), and those among them it never answers,
because no record of the spans it was trained on carries them: a class that a span held back by the data
check brought, below a class a span let in brought later, or a class whose every file ingest refused. The
model's export gives those classes probability 0: it never answers a class it has no record of."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LabelSet:
    labels: list[str]  # index = label id
    untrained: list[str] = dataclasses.field(default_factory=list)  # classes of `labels` it never answers

    @property
    def answered(self) -> list[str]:
        """The classes the model answers, in id order."""
        return [name for name in self.labels if name not in self.untrained]
