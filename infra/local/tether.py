"""Run a command for as long as the process that started it lives: ``python tether.py COMMAND...``.

The owner starts this script in a session of its own (out of reach of a terminal's Ctrl-C) with
its standard input a pipe whose write end only the owner holds.  However the owner ends -- its
own ``stop``, an exit, SIGTERM's default action, SIGKILL, ``os._exit`` -- the kernel closes that
end, this script reads end-of-file and ends the command.  (``PR_SET_PDEATHSIG`` would tie the
command to the *thread* that started it, and a Prefect task's thread ends long before its
process.)  The command runs in this script's process group: ``killpg`` of this script's pid ends
both.  Run as a script, not imported: it needs nothing but the standard library.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading


def main(command: list[str]) -> int:
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def end(*_args) -> None:
        if child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGHUP, end)

    def watch_owner() -> None:
        sys.stdin.buffer.read()  # returns when the owner's end of the pipe is closed: the owner is gone
        end()

    threading.Thread(target=watch_owner, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
