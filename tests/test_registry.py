"""The registry behind every extension point, and the plugins that fill registries."""
from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from paddletrain import plugins as plugins_module
from paddletrain import registry as registry_module
from paddletrain.plugins import PluginError, import_modules, load_plugins
from paddletrain.registry import Registry, UnknownNameError


def test_register_get_and_list():
    things: Registry = Registry("thing", "things.name")

    @things.register()
    def alpha():
        return "a"

    things.register("beta_two")(lambda: "b")
    assert things.get("alpha") is alpha and things.get("beta_two")() == "b"
    assert things.names() == ["alpha", "beta_two"] and things.names("b*") == ["beta_two"]
    assert "alpha" in things and "gamma" not in things and len(things) == 2
    things.register()(alpha)  # the same factory again is harmless (a module imported twice)


def test_a_taken_name_is_refused_naming_both_factories():
    things: Registry = Registry("thing", "things.name")
    things.register("x")(lambda: 1)

    def other():
        return 2

    with pytest.raises(ValueError, match=r"thing 'x' is already registered by .*<lambda>; rename .*other"):
        things.register("x")(other)


def test_an_unknown_name_names_the_config_key_and_close_names(monkeypatch):
    monkeypatch.setattr(plugins_module, "_plugins_loaded", True)
    things: Registry = Registry("optimizer", "optim.name")
    things.register("adamw")(object)
    things.register("sgd")(object)
    with pytest.raises(UnknownNameError, match=r"unknown optimizer optim.name='adamv'; did you mean adamw\?") as err:
        things.get("adamv")
    assert "registered: adamw, sgd" in str(err.value)


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module on sys.path that registers 'plugged' into a registry when imported, and an entry point for it."""
    things: Registry = Registry("thing", "things.name")
    monkeypatch.setattr(registry_module, "_test_things", things, raising=False)
    (tmp_path / "my_plugin_mod.py").write_text(textwrap.dedent("""
        from paddletrain import registry
        registry._test_things.register("plugged")(len)
    """))
    (tmp_path / "broken_plugin_mod.py").write_text("raise RuntimeError('half-written plugin')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins_module, "_plugins_loaded", False)
    yield things
    for name in ("my_plugin_mod", "broken_plugin_mod"):
        sys.modules.pop(name, None)


def _entry_points(*specs):
    return lambda group: [EntryPoint(name=n, value=v, group=group) for n, v in specs] if group else []


def test_an_unknown_name_loads_the_installed_plugins_once(plugin_module, monkeypatch):
    monkeypatch.setattr(plugins_module, "entry_points", _entry_points(("mine", "my_plugin_mod")))
    assert "plugged" not in plugin_module
    assert plugin_module.get("plugged") is len
    assert load_plugins() == []  # already loaded by the lookup


def test_a_plugin_that_fails_to_import_is_named(plugin_module, monkeypatch):
    monkeypatch.setattr(plugins_module, "entry_points", _entry_points(("bad", "broken_plugin_mod")))
    with pytest.raises(PluginError, match=r"plugin 'bad' \(broken_plugin_mod.*RuntimeError: half-written plugin"):
        load_plugins()


def test_the_imports_key_imports_modules_and_names_a_missing_one(plugin_module):
    import_modules(["my_plugin_mod"])
    assert "plugged" in plugin_module
    with pytest.raises(PluginError, match=r"imports: cannot import 'no_such_module_xyz'"):
        import_modules(["no_such_module_xyz"])
