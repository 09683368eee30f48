"""paddletrain: a reusable training library for image classification on PaddlePaddle.

>>> import paddletrain
>>> model = paddletrain.create_model("resnet20", num_classes=10)
"""

__version__ = "0.1.0"

from paddletrain.callbacks import Callback, StepOutput  # noqa: E402
from paddletrain.errors import ConfigError, NonFiniteLossError, TrainingInterrupted, UserError  # noqa: E402
from paddletrain.inference import Predictor  # noqa: E402
from paddletrain.models import create_model, list_models, register_model  # noqa: E402
from paddletrain.models.pretrained import load_pretrained  # noqa: E402
from paddletrain.precision import Precision  # noqa: E402
from paddletrain.trainer import Trainer  # noqa: E402

__all__ = ["Callback", "ConfigError", "NonFiniteLossError", "Precision", "Predictor", "StepOutput", "Trainer",
           "TrainingInterrupted", "UserError", "__version__", "create_model", "list_models", "load_pretrained",
           "register_model"]
