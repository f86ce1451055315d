"""The `tieredkv` console command: the CLI in a forked child, so that a crash inside a native library
becomes one line that says what to do.

LMDB checksums nothing: a damaged page pointer in `data.mdb` can make liblmdb read where no page is
(SIGBUS) or fail an assertion (SIGABRT), and the process dies before Python can say a word. The parent
forks before anything heavy is imported (no torch, no threads: a safe fork), waits, and passes the
child's exit status through; if a signal ended the child, it prints the one line. Where fork is
unavailable, or threads already run, the CLI runs in this process as before.

NOTE: nothing here imports torch or the CLI until the child runs: importing torch starts a thread.
"""
from __future__ import annotations

import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGHUP)  # SIGINT reaches the child from the terminal by itself
CRASHES = {signal.SIGBUS, signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}


def run() -> None:
    """Entry point of the `tieredkv` command (and `python -m tieredkv`)."""
    argv = sys.argv[1:]
    if not hasattr(os, "fork") or _threads() > 1:
        sys.exit(_main(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(argv)
    sys.exit(_parent(pid, argv))


def _threads() -> int:
    """Threads of this process (Linux; 1 where it cannot be told)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _main(argv: list[str]) -> int:
    from tieredkv.cli.main import main

    return main(argv)


def _child(argv: list[str]) -> None:
    code = 2
    try:
        code = _main(argv)
    finally:  # NOTE: os._exit skips the interpreter's flush: flush here (a closed pipe is _main's to report)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if isinstance(code, int) else 2)


def _parent(pid: int, argv: list[str]) -> int:
    def forward(signum, _frame) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child handles Ctrl-C ("interrupted", 130)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            return 2
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    signum = signal.Signals(-code)
    if signum in CRASHES:
        print(crash_line(signum.name, argv), file=sys.stderr)
        return 2
    if signum == signal.SIGKILL:
        print(f"tieredkv: error: tieredkv {_command(argv)} was killed (SIGKILL); out of memory is the usual cause "
              "(the kernel's OOM killer: see `dmesg`): give it a shorter document or context, or more memory",
              file=sys.stderr)
    return 128 - code  # as a shell reports a process a signal ended


def _command(argv: list[str]) -> str:
    return " ".join(a for a in argv[:2] if not a.startswith("-")) or "(no command)"


def crash_line(signame: str, argv: list[str]) -> str:
    """The one line for a child that a crash signal ended."""
    store = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--store"), None)
    store = next((a.split("=", 1)[1] for a in argv if a.startswith("--store=")), store)
    where = (f"`tieredkv check --store {store}` reports what is damaged; then restore the store from a backup or "
             "re-deposit its artifacts into a new one") if store is not None else \
        "if it read a store, `tieredkv check --store DIR` reports what is damaged"
    return (f"tieredkv: error: tieredkv {_command(argv)} crashed ({signame}) inside a native library. A damaged "
            f"store is the known cause (LMDB checksums nothing, and a bad page pointer makes it read where no page "
            f"is): {where}. Otherwise run it again as `python -X faulthandler -m tieredkv.cli ...` to see where, "
            "and report it")


if __name__ == "__main__":
    run()
