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
import shlex
import signal
import sys

# signals whose default ends a process: passed on to the child (SIGINT reaches it from the terminal itself)
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
GROUPS = ("library", "remote")  # commands with subcommands: both words name the command
CRASHES = {signal.SIGBUS, signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}


def run() -> None:
    """Entry point of the `tieredkv` command (and `python -m tieredkv`)."""
    argv = sys.argv[1:]
    if not hasattr(os, "fork") or _threads() > 1:
        sys.exit(_main(argv))
    _flush()
    # NOTE: a SIGTERM between fork and the parent's handlers would end the parent alone and orphan the
    # child: hold the forwarded signals until the handlers are in place (the child restores its mask)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    on_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child handles Ctrl-C ("interrupted", 130)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # NOTE: inherited as ignored, the child would be reaped unseen
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, on_int)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _child(argv, parent)
    sys.exit(_parent(pid, argv, mask))


def _threads() -> int:
    """Threads of this process (Linux; 1 where it cannot be told)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _main(argv: list[str]) -> int:
    from tieredkv.cli.main import main

    return main(argv)


def _child(argv: list[str], parent: int) -> None:
    """Run the CLI and leave with its status: os._exit, never back into the parent's code."""
    _die_with_parent(parent)
    code: object = 2
    try:
        code = _main(argv)
    except SystemExit as exc:  # sys.exit inside a command: its status, as the interpreter would give it
        code = exc.code
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # Ctrl-C before main() could catch it (while the CLI imports)
        print("tieredkv: interrupted", file=sys.stderr)
        code = 130
    except BaseException:  # noqa: BLE001 - main() turns every Exception into a line; this is what escapes it
        import traceback

        traceback.print_exc()
    finally:
        code = 0 if code is None else code & 0xFF if isinstance(code, int) else 2
        os._exit(_flush_output(code))


def _flush(*streams) -> None:
    """Flush `streams` (stdout and stderr if none named), whatever fails."""
    for stream in streams or (sys.stdout, sys.stderr):  # None where the descriptor was closed (`>&-`)
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _flush_output(code: int) -> int:
    """Flush what the command left in stdout's buffer (os._exit would drop it): `code`, or the status of a
    failed write. NOTE: the interpreter's own flush at exit would say this, but os._exit skips it."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`): quiet, as cat, with SIGPIPE's status
        code = 141
    except (OSError, ValueError) as exc:
        from tieredkv.cli.main import error_line

        code = 2
        _say(error_line(exc))
    _flush(sys.stderr)
    return code


def _die_with_parent(parent: int) -> None:
    """Linux: the child is sent SIGTERM if the parent dies (SIGKILL cannot be forwarded), so that no command
    runs on, orphaned, after its caller saw it end."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGTERM)


def _parent(pid: int, argv: list[str], mask) -> int:
    def forward(signum, _frame) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:  # cannot happen with SIGCHLD at its default; said, not silent, if it does
            _say(f"tieredkv: error: tieredkv {_command(argv)}: its process ended unseen (no exit status); run it "
                 "again")
            return 2
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    signum = signal.Signals(-code)
    if signum in CRASHES:
        _say(crash_line(signum.name, argv))
        return 2
    if signum == signal.SIGKILL:
        _say(f"tieredkv: error: tieredkv {_command(argv)} was killed (SIGKILL); out of memory is the usual cause "
             "(the kernel's OOM killer: see `dmesg`): give it a shorter document or context, or more memory")
    return 128 - code  # as a shell reports a process a signal ended


def _say(line: str) -> None:
    if sys.stderr is not None:  # NOTE: print(file=None) would write to stdout
        print(line, file=sys.stderr)


def _command(argv: list[str]) -> str:
    """The command's name: its first word, and the second for a group (`library solve`)."""
    words = [a for a in argv if not a.startswith("-")][:2]
    return " ".join(words if words[:1] and words[0] in GROUPS else words[:1]) or "(no command)"


def _store(argv: list[str]) -> str | None:
    """The --store the command used: the last one, as argparse takes it (`--store D` or `--store=D`)."""
    store = None
    for i, a in enumerate(argv):
        if a == "--store" and i + 1 < len(argv):
            store = argv[i + 1]
        elif a.startswith("--store="):
            store = a.split("=", 1)[1]
    return store


def crash_line(signame: str, argv: list[str]) -> str:
    """The one line for a child that a crash signal ended."""
    store = _store(argv)
    if store is None and _command(argv) == "qa":
        store = os.environ.get("TIEREDKV_STORE") or None  # qa's default store when set
    where = (f"`tieredkv check --store {shlex.quote(store)}` reports what is damaged; then restore the store from "
             "a backup or re-deposit its artifacts into a new one") if store is not None else \
        ("`tieredkv check --store DIR` on qa's default store (stores/MODEL under $TIEREDKV_CACHE, else "
         "~/.cache/tieredkv) reports what is damaged; move that store aside and qa ingests the document again") \
        if _command(argv) == "qa" else "if it read a store, `tieredkv check --store DIR` reports what is damaged"
    return (f"tieredkv: error: tieredkv {_command(argv)} crashed ({signame}) inside a native library. A damaged "
            f"store is the known cause (LMDB checksums nothing, and a bad page pointer makes it read where no page "
            f"is): {where}. Otherwise run it again as `python -X faulthandler -m tieredkv.cli ...` to see where, "
            "and report it")


if __name__ == "__main__":
    run()
