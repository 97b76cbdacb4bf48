"""A one-stage detector's raw head judged by the detections taken from it: score threshold, then NMS, per image.

A detector's head ``[batch, 4 + classes, anchors]`` holds box sizes for every anchor, and most anchors' best class
score is ~0: an INT8 head failed ``max_norm_err`` .318 on box sizes of anchors with scores ≤ .003, which any threshold
discards, while its detections after threshold and NMS agreed (F1 .959). So each image's detections are decoded from
FP32's head and from the candidate's, the same way (boxes, best class and score, threshold, class-aware greedy NMS),
and matched (same class, IoU ≥ :data:`MATCH_IOU`, highest scores first): F1 per image, its mean and worst, and the
matched boxes' IoU. The raw metrics are taken on the anchors FP32 keeps only. A detection whose FP32 score lies within
the noise the case's cosine bound allows of the threshold (:func:`quantverdict.judge.map_decisions.allowed_noise`)
is not FP32's decision: missing it, or adding it, is no error.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantverdict.judge.map_decisions import allowed_noise
from quantverdict.models.spec import DetectionFormat

MATCH_IOU = 0.5  # COCO's matching threshold at mAP@.5: the same object
MAX_DETECTIONS = 300  # per image, as Ultralytics' NMS keeps


@dataclass(frozen=True)
class Detections:
    """One image's detections: anchor indices, boxes ``[n, 4]`` as x1 y1 x2 y2, scores and classes."""

    anchors: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray


def _attributes(head: np.ndarray, layout: DetectionFormat) -> np.ndarray:
    """One image's head as ``[anchors, attributes]``: the attributes are the axis the layout names, else the shorter
    one (``[84, 8400]`` and ``[25200, 85]`` are both read right)."""
    if head.ndim != 2:
        raise ValueError(f"a detection head is [batch, attributes, anchors] or [batch, anchors, attributes]; got an "
                         f"image of shape {list(head.shape)}")
    axis = layout.attribute_axis - 1 if layout.attribute_axis else int(np.argmin(head.shape))
    attributes = np.array(head if axis == 1 else head.T, np.float64)
    if layout.grid:
        attributes[:, :4] = _on_grid(attributes[:, :4], layout)
    return attributes


def _on_grid(offsets: np.ndarray, layout: DetectionFormat) -> np.ndarray:
    """Boxes (cx cy w h in pixels) from a head's offsets on its grids (:attr:`DetectionFormat.grid`): each level's
    cells row by row, as YOLOX's own decoding lays them out."""
    if layout.image is None:
        raise ValueError("a head on grids needs the image's size: a first input of shape [..., height, width]")
    height, width = layout.image
    cells = [np.stack([x.ravel(), y.ravel(), np.full(x.size, stride)], 1) for stride in layout.grid
             for y, x in [np.mgrid[:height // stride, :width // stride]]]
    grid = np.concatenate(cells).astype(np.float64)
    if len(grid) != len(offsets):
        raise ValueError(f"a head on grids of strides {list(layout.grid)} over a {height} × {width} image has "
                         f"{len(grid)} anchors; this one has {len(offsets)}")
    stride = grid[:, 2:]
    return np.concatenate([(offsets[:, :2] + grid[:, :2]) * stride, np.exp(offsets[:, 2:4]) * stride], axis=1)


def decode(head: np.ndarray, layout: DetectionFormat, threshold: float) -> Detections:
    """Boxes, best class and score of every anchor scoring at least ``threshold``, after class-aware NMS."""
    attributes = _attributes(head, layout)
    first = 5 if layout.objectness else 4
    scores = attributes[:, first:]
    if layout.objectness:
        scores = scores * attributes[:, 4:5]
    best, classes = scores.max(axis=1), scores.argmax(axis=1)
    anchors = np.flatnonzero(best >= threshold)
    boxes = attributes[anchors, :4]
    if layout.boxes == "cxcywh":
        boxes = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], axis=1)
    keep = _nms(boxes, best[anchors], classes[anchors], layout.nms_iou)
    return Detections(anchors[keep], boxes[keep], best[anchors][keep], classes[anchors][keep])


@dataclass(frozen=True, eq=False)
class OnKept:
    """A detector head as the verdict's raw metrics read it (:func:`detection_metrics`): each image's attributes of
    the anchors FP32's detections come from (boxes in pixels on a grid head), ``[images, most kept, attributes]``, zero
    past an image's own. A search's scores and its ranking of layers read a head so; picklable, for its workers."""

    layout: DetectionFormat
    kept: tuple[np.ndarray, ...]  # each image's anchors, of FP32's heads

    @classmethod
    def of(cls, reference: np.ndarray, layout: DetectionFormat) -> "OnKept":
        """The view that FP32's heads ``reference`` (images first) define."""
        return cls(layout, tuple(decode(head, layout, layout.score).anchors for head in reference))

    def __call__(self, heads: np.ndarray) -> np.ndarray:
        """``heads`` (the first images of the reference's, or all) as wide as all the reference's would be."""
        rows = [_attributes(head, self.layout)[anchors] for head, anchors in zip(heads, self.kept)]
        width = max((len(anchors) for anchors in self.kept), default=0)
        out = np.zeros((len(rows), width, rows[0].shape[1] if rows else 0))
        for image, row in enumerate(rows):
            out[image, :len(row)] = row
        return out


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` with every box of ``b`` (x1 y1 x2 y2): ``[len(a), len(b)]``."""
    low, high = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=2)
    union = _area(a)[:, None] + _area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0, None), axis=1)


def _nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float) -> np.ndarray:
    """Greedy NMS per class (highest score first), at most :data:`MAX_DETECTIONS`: the indices kept."""
    order, kept = np.argsort(-scores, kind="stable"), []
    suppressed = np.zeros(len(scores), bool)
    overlaps = iou(boxes, boxes) if len(boxes) else np.zeros((0, 0))
    for index in order:
        if suppressed[index]:
            continue
        kept.append(index)
        if len(kept) == MAX_DETECTIONS:
            break
        suppressed |= (overlaps[index] > threshold) & (classes == classes[index])
    return np.asarray(kept, int)


def _matched(reference: Detections, candidate: Detections) -> list[tuple[int, int, float]]:
    """Greedy matching, highest candidate score first: (reference index, candidate index, IoU) of the same class."""
    overlaps = iou(candidate.boxes, reference.boxes) if len(candidate.boxes) and len(reference.boxes) else None
    taken, pairs = set(), []
    for c in np.argsort(-candidate.scores, kind="stable"):
        if overlaps is None:
            break
        fits = [(overlaps[c, r], r) for r in range(len(reference.boxes))
                if r not in taken and reference.classes[r] == candidate.classes[c] and overlaps[c, r] >= MATCH_IOU]
        if fits:
            best, r = max(fits)
            taken.add(r)
            pairs.append((r, int(c), float(best)))
    return pairs


def detection_metrics(reference: np.ndarray, candidate: np.ndarray, layout: DetectionFormat,
                      min_cosine: float | None) -> tuple[dict[str, float | int], np.ndarray]:
    """Per image F1 of the candidate's detections against FP32's (mean, worst and which image, the share identical),
    the matched boxes' mean IoU and the detections counted; and the FP32-kept anchors' attributes of both, stacked
    ``[2, kept, attributes]``, for the raw metrics."""
    f1s, ious, counted, kept_ref, kept_out = [], [], 0, [], []
    for ref_head, out_head in zip(reference, candidate):
        ref, out = decode(ref_head, layout, layout.score), decode(out_head, layout, layout.score)
        band = allowed_noise(min_cosine) * (float(np.sqrt(np.mean(ref.scores ** 2))) if len(ref.scores) else 0.0)
        pairs = _matched(ref, out)
        hit_ref, hit_out = {r for r, _, _ in pairs}, {c for _, c, _ in pairs}
        missed = sum(score >= layout.score + band for r, score in enumerate(ref.scores) if r not in hit_ref)
        added = sum(score >= layout.score + band for c, score in enumerate(out.scores) if c not in hit_out)
        matched = len(pairs)
        f1s.append(1.0 if matched + missed + added == 0 else 2 * matched / (2 * matched + missed + added))
        ious += [overlap for _, _, overlap in pairs]
        counted += len(ref.scores)
        kept_ref.append(_attributes(ref_head, layout)[ref.anchors])
        kept_out.append(_attributes(out_head, layout)[ref.anchors])
    f1 = np.asarray(f1s)
    found: dict[str, float | int] = {
        "detection_f1": float(f1.mean()), "detection_f1_worst": float(f1.min()),
        "detection_f1_worst_image": int(f1.argmin()), "detections_identical": float(np.mean(f1 == 1.0)),
        "detections_reference": counted, "detection_score_threshold": layout.score}
    if ious:
        found["matched_iou"] = float(np.mean(ious))
    return found, np.stack([np.concatenate(kept_ref), np.concatenate(kept_out)])
