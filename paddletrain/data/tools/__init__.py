"""The dataset tools behind ``python -m paddletrain.data``: the check of everything a loader would read, and the
split of a folder into label lists. They need no framework."""
