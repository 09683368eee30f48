"""tests/forked.py: a command forked from the warm server ends, prints and sees its files and environment as
the same command in a fresh interpreter does."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests import forked

MODULE = textwrap.dedent("""
    import os, sys
    print("out", sys.argv[1:], os.path.basename(os.getcwd()), os.environ.get("GREETING"), flush=True)
    print("err", file=sys.stderr)
    if "raise" in sys.argv:
        raise ValueError("boom")
    if "exit" in sys.argv:
        sys.exit(7)
    if "sleep" in sys.argv:
        import time
        time.sleep(60)
""")


def _both(tmp_path, args, extra=None, timeout=60.0):
    (tmp_path / "probe.py").write_text(MODULE)
    base = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env = {**base, **(extra or {})}
    warm = forked.run_module("probe", args, tmp_path, env, timeout, server_env=base)
    fresh = subprocess.run([sys.executable, "-m", "probe", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=timeout)
    return warm, fresh


@pytest.mark.parametrize("args, code", [(["a", "b"], 0), (["exit"], 7), (["raise"], 1)])
def test_exit_code_stdout_and_stderr_are_those_of_a_fresh_process(tmp_path, args, code):
    warm, fresh = _both(tmp_path, args, {"GREETING": "hi"})
    assert warm.returncode == fresh.returncode == code
    assert warm.stdout == fresh.stdout == f"out {args} {tmp_path.name} hi\n"
    assert warm.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == "err"
    if code == 1:
        assert warm.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "ValueError: boom"


def test_the_command_is_forked_and_a_variable_read_at_start_up_gets_a_fresh_interpreter(tmp_path):
    (tmp_path / "pid.py").write_text("import os\nprint(os.getppid())\n")
    base = {**os.environ, "PYTHONWARNINGS": "ignore"}
    warm = forked.run_module("pid", [], tmp_path, base, 60, server_env=base)
    assert int(warm.stdout) in forked.server_pids()
    fresh = forked.run_module("pid", [], tmp_path, {**base, "FLAGS_use_mkldnn": "0"}, 60, server_env=base)
    assert int(fresh.stdout) == os.getpid()


def test_a_command_over_its_timeout_is_killed_and_raises_like_subprocess_run(tmp_path):
    (tmp_path / "probe.py").write_text(MODULE)
    base = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run_module("probe", ["sleep"], tmp_path, base, 2, server_env=base)
    again = forked.run_module("probe", ["x"], tmp_path, base, 60, server_env=base)  # the server still serves
    assert again.returncode == 0 and again.stdout.startswith("out ['x']")
