"""Packaged YAML presets, one directory per config group, validated by paddletrain.config."""
