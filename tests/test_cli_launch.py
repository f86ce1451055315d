"""The `tieredkv` command runs the CLI in a forked child (tieredkv/launch.py): a crash inside a native
library becomes one line that says what to do, and exit statuses and signals pass through.

A crash is made real with a sitecustomize on the child's PYTHONPATH that kills the forked child with the
signal (os.register_at_fork), as liblmdb does on a damaged page pointer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tieredkv(args: list[str], hook: str | None, tmp_path: Path, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    paths = [str(ROOT)]
    if hook is not None:
        site = tmp_path / "hook"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(hook)
        paths.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.Popen([sys.executable, "-m", "tieredkv", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def is_one_line_error(err: str) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith("tieredkv: error: ") and "Traceback" not in err


def _done(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.parametrize("signame", ["SIGBUS", "SIGSEGV", "SIGABRT"])
def test_a_crash_in_the_child_is_one_line_naming_check(tmp_path, signame):
    store = tmp_path / "kv"
    hook = f"import os, signal\nos.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.{signame}))\n"
    code, out, err = _done(_tieredkv(["stats", "--store", str(store)], hook, tmp_path))
    assert code == 2 and out == ""  # was: the shell's "Bus error (core dumped)", status 135
    assert is_one_line_error(err), err
    assert f"tieredkv stats crashed ({signame}) inside a native library" in err
    assert f"`tieredkv check --store {store}` reports what is damaged" in err


def test_a_child_the_kernel_killed_is_one_line_naming_memory(tmp_path):
    hook = "import os, signal\nos.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
    code, out, err = _done(_tieredkv(["stats", "--store", str(tmp_path)], hook, tmp_path))
    assert code == 137 and is_one_line_error(err) and "killed (SIGKILL); out of memory" in err


def test_status_and_output_pass_through(tmp_path):
    code, out, err = _done(_tieredkv(["--help"], None, tmp_path))
    assert code == 0 and "usage: tieredkv" in out and err == ""
    missing = tmp_path / "nowhere"
    code, out, err = _done(_tieredkv(["stats", "--store", str(missing)], None, tmp_path))
    assert code == 2 and out == "" and is_one_line_error(err)
    assert err.startswith(f"tieredkv: error: InputError: --store {missing} does not exist")


def test_sigterm_reaches_the_child_and_nothing_is_left_running(tmp_path):
    ready = tmp_path / "child-pid"
    hook = ("import os, time\n"
            "def _wait():\n"
            f"    open({str(ready)!r} + '.tmp', 'w').write(str(os.getpid())); os.rename({str(ready)!r} + '.tmp', "
            f"{str(ready)!r})\n"
            "    time.sleep(60)\n"
            "os.register_at_fork(after_in_child=_wait)\n")
    proc = _tieredkv(["stats", "--store", str(tmp_path)], hook, tmp_path)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    child = int(ready.read_text())
    time.sleep(0.5)  # the parent installs its handlers right after fork
    proc.send_signal(signal.SIGTERM)
    code, out, err = _done(proc)
    assert code == 128 + signal.SIGTERM and err == ""  # ended as the shell reports it, no error line
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the child is gone (reaped), not orphaned
