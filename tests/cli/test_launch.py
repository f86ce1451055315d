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

from testkit.trust_faults import one_line

ROOT = Path(__file__).resolve().parent.parent.parent


def is_one_line_error(err: str) -> bool:
    return one_line(err) and err.startswith("tieredkv: error: ")


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


def test_the_crash_line_names_the_store_argparse_used(tmp_path):
    hook = "import os, signal\nos.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGBUS))\n"
    spaced = tmp_path / "my store"
    code, _, err = _done(_tieredkv(["library", "list", "--store", "elsewhere", f"--store={spaced}"], hook, tmp_path))
    assert code == 2 and "tieredkv library list crashed (SIGBUS)" in err
    assert f"`tieredkv check --store '{spaced}'` reports" in err  # the last one, quoted to paste
    code, _, err = _done(_tieredkv(["qa", "--question", "What?"], hook, tmp_path))
    assert code == 2 and "on qa's default store (stores/MODEL under $TIEREDKV_CACHE" in err  # qa names its own


def test_a_child_the_kernel_killed_is_one_line_naming_memory(tmp_path):
    hook = "import os, signal\nos.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
    code, out, err = _done(_tieredkv(["stats", "--store", str(tmp_path)], hook, tmp_path))
    assert code == 137 and is_one_line_error(err) and "killed (SIGKILL); out of memory" in err


def test_status_and_output_pass_through(tmp_path):
    code, out, err = _done(_tieredkv(["--help"], None, tmp_path))
    assert code == 0 and "usage: tieredkv" in out and err == ""
    code, out, err = _done(_tieredkv(["--version"], None, tmp_path))
    assert code == 0 and out.startswith("tieredkv 0.") and err == ""
    missing = tmp_path / "nowhere"
    code, out, err = _done(_tieredkv(["stats", "--store", str(missing)], None, tmp_path))
    assert code == 2 and out == "" and is_one_line_error(err)
    assert err.startswith(f"tieredkv: error: InputError: --store {missing} does not exist")


def test_a_failed_last_write_of_the_output_is_an_error(tmp_path):
    with open("/dev/full", "w") as full:  # the output stays buffered until the child flushes it at exit
        proc = subprocess.Popen([sys.executable, "-m", "tieredkv", "--help"], stdout=full, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": ""})
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and is_one_line_error(err)  # was: exit 0, the output lost
    assert "No space left on device" in err


def _pid_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith(("Z", "X"))
    except (FileNotFoundError, ProcessLookupError):
        return True


def _long_running(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """A `tieredkv verify` that would run for minutes, and its child's pid once the child is at work."""
    ready = tmp_path / "child-pid"
    hook = ("import os\n"
            f"os.register_at_fork(after_in_child=lambda: open({str(ready)!r}, 'w').write(str(os.getpid())))\n")
    proc = _tieredkv(["verify", "--model", "tiny-llama", "--samples", "100000", "--tokens", "16", "--continuation",
                      "2", "--quiet"], hook, tmp_path)
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    child = int(ready.read_text())
    time.sleep(2)  # past the fork: the parent's handlers and the child's death signal are in place
    assert not _pid_gone(child) and proc.poll() is None
    return proc, child


def test_a_child_whose_parent_was_killed_stops_too(tmp_path):
    """SIGKILL cannot be forwarded: the child asks the kernel for SIGTERM when its parent dies."""
    proc, child = _long_running(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while not _pid_gone(child):  # was: the child ran on, orphaned, and wrote its result later
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.1)


def test_sigterm_reaches_the_child_and_nothing_is_left_running(tmp_path):
    proc, child = _long_running(tmp_path)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _done(proc)
    assert code == 128 + signal.SIGTERM and err == ""  # ended as the shell reports it, no error line
    assert _pid_gone(child)  # the child is gone (reaped), not orphaned


def test_the_launcher_forks_before_torch_is_imported(tmp_path):
    """The fork is safe only while the process has one thread; importing torch starts one. If an import
    crept into tieredkv.launch, the launcher would run the CLI without its guard (threads > 1)."""
    probe = "import os, sys, tieredkv.launch; print('torch' in sys.modules, len(os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == ["False", "1"]


@pytest.mark.parametrize("args", [["--version"], ["qa", "--help"], ["qa", "--local-pages", "0"],
                                  ["graft", "--store", "no/such/store", "--artifact", "x", "--prompt", "p"],
                                  ["check", "--store", "no/such/store"]])
def test_help_usage_errors_and_a_missing_store_import_no_torch(args, tmp_path):
    """Building the parser and refusing a missing store import neither torch nor transformers (2.7 s on
    this VM): `--help` and a mistyped command answer at once, and check's outer process stays small."""
    probe = ("import sys, runpy; sys.argv = ['tieredkv', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('tieredkv.cli', run_name='__main__')\n"
             "except SystemExit as exc:\n    code = exc.code\n"
             "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'lmdb') if m in sys.modules), code, "
             "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stderr.splitlines()[-1] == f"[] {0 if args[-1] in ('--version', '--help') else 2}", done.stderr
