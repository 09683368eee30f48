"""Hyper-parameter search: Optuna studies composed by Hydra (``hydra/sweeper=paddletrain_optuna``).

- :mod:`~paddletrain.search.space`: Hydra's sweep grammar -> Optuna distributions, checked against the schema;
- :mod:`~paddletrain.search.sweeper`: the sweeper (trials, continuation after a kill, parallel trials);
- :mod:`~paddletrain.search.pruning`: the callback that reports each validation and stops a pruned trial;
- :mod:`~paddletrain.search.storage`: a journal file in the sweep directory, or a database across machines;
- :mod:`~paddletrain.search.report`: best.yaml, study.json, study.md and the pictures.
"""
