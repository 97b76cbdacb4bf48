"""What a view of the artifact store is given besides its data: the defect it plants (:class:`Planter`) and the tables
it shares with the store it was made from (:class:`Shared`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantverdict.memo import Memo
from quantverdict.models.spec import Batch

MEMO_SIZE = 4  # torch modules and reference outputs kept per process (ResNet-101 is large)


class Planter:
    """No defect: the artifacts as the stages make them. A planted defect's planter
    (:class:`quantverdict.run.mutate.MutationPlanter`) changes one stage's graph or the calibration batches."""

    def graph(self, stage: str, path: Path, precision: str | None = None) -> Path:
        return path

    def batches(self, batches: list[Batch]) -> list[Batch]:
        return batches

    def key(self) -> Any:
        """What besides the data makes a store's choices differ, for their keys."""
        return None


@dataclass(frozen=True)
class Shared:
    """What a store makes once per process, each table shareable with a view of the store that it does not differ
    in: torch modules, FP32 reference outputs, FP32 graphs."""

    modules: Memo = field(default_factory=lambda: Memo(MEMO_SIZE))
    references: Memo = field(default_factory=lambda: Memo(MEMO_SIZE))
    fp32: Memo = field(default_factory=Memo)
