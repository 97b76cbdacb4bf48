"""How a manifest says an output is read, where its kind asks for more than its values: a detector head's layout and
a sequence output's blank symbol (the schema's part for them; :mod:`quantverdict.run.manifest` holds the rest)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Entry(BaseModel):
    """A part of the manifest: a key it does not know is refused, naming it."""

    model_config = ConfigDict(extra="forbid")


class DetectionEntry(Entry):
    """A detector head's layout (quantverdict.models.spec.DetectionFormat)."""

    boxes: Literal["cxcywh", "xyxy"] = "cxcywh"
    objectness: bool = False
    attribute_axis: Literal[1, 2] | None = None
    score: Annotated[float, Field(gt=0, lt=1)] = 0.25
    nms_iou: Annotated[float, Field(gt=0, le=1)] = 0.45
    grid: list[Annotated[int, Field(gt=0)]] = []


class SequenceEntry(Entry):
    """A sequence output's reading (quantverdict.models.spec.SequenceFormat)."""

    blank: Annotated[int, Field(ge=0)] = 0
    batch_axis: Literal[0, 1] = 0
