"""The training engine: the loop and what it runs on.

- :mod:`~paddletrain.engine.trainer`: ``Trainer`` (fit / validate / predict over built objects);
- :mod:`~paddletrain.engine.callback`: the callback contract (hooks, their order, ``StepOutput``);
- :mod:`~paddletrain.engine.limits`, :mod:`~paddletrain.engine.hooks`, :mod:`~paddletrain.engine.precision`:
  what bounds the loop, the optional methods of loaders and samplers, AMP and loss scaling;
- :mod:`~paddletrain.engine.state`: a run's state saved and loaded side by side (checked by
  :mod:`~paddletrain.engine.state_checks`); :mod:`~paddletrain.engine.resume`: which checkpoint a run continues;
- :mod:`~paddletrain.engine.summary`: the run's ``summary.json``.

Nothing here reads config: :mod:`paddletrain.build` hands the engine built objects.
"""
