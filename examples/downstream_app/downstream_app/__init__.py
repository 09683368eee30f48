"""An example paddletrain plugin: importing this package registers its model and its dataset."""
from __future__ import annotations

from downstream_app import data, models  # noqa: F401  (register "bars" and "tiny_resnet")
