"""Deployment: a trained checkpoint taken to the runtimes that serve it, and proven against it.

- :mod:`~paddletrain.deploy.exporter`: checkpoint -> Paddle Inference (fp32, bf16, int8) and ONNX;
- :mod:`~paddletrain.deploy.quantize` with :mod:`~paddletrain.deploy.bias_correction` and
  :mod:`~paddletrain.deploy.divergence`: post-training int8 quantization;
- :mod:`~paddletrain.deploy.predictor`: ``Predictor`` over an exported model; :mod:`~paddletrain.deploy.inputs`,
  :mod:`~paddletrain.deploy.decoding`, :mod:`~paddletrain.deploy.native_output`: what it reads and how;
- :mod:`~paddletrain.deploy.batch_prediction` and :mod:`~paddletrain.deploy.shipping`: batched prediction over files
and the
  report across runtimes.

The commands ``python -m paddletrain.export|predict|ship`` are thin wrappers over these modules.
"""
