"""Metrics: single-label (top-k, per-class report, confusion matrix, throughput) and multi-label (mAP, F1).

Both meters have one interface (``update``, ``compute``, ``report``, ``state_dict``), so the Trainer, evaluate and
ship take either.
"""
from __future__ import annotations

from paddletrain.metrics.multilabel import (
    LossMeter,
    MultiLabelMeter,
    MultiLabelReport,
    average_precision,
    multilabel_report,
)
from paddletrain.metrics.single_label import (
    MAX_CONFUSION_CLASSES,
    ClassificationMeter,
    ClassReport,
    Throughput,
    class_names_for,
    topk_correct,
)

__all__ = ["MAX_CONFUSION_CLASSES", "ClassReport", "ClassificationMeter", "LossMeter", "MultiLabelMeter",
           "MultiLabelReport", "Throughput", "average_precision", "class_names_for", "multilabel_report",
           "topk_correct"]
