"""A child for the fork server's tests: prints what it runs with as JSON, then does as told.

`python -m tests.support.forkee CODE [sleep|thread]`: prints `{"argv", "cwd", "env", "pid",
"ppid", "sid"}` and exits with CODE; `sleep` first waits to be killed; `thread` first starts a
non-daemon thread that the exit must wait for.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main() -> None:
    code = int(sys.argv[1])
    what = sys.argv[2] if len(sys.argv) > 2 else ""
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "cwd": os.getcwd(),
                "env": os.environ.get("FORKEE_MARK"),
                "pid": os.getpid(),
                "sid": os.getsid(0),
                "stdin": os.read(0, 10).decode(),
            }
        ),
        flush=True,
    )
    if what == "sleep":
        time.sleep(600)
    if what == "thread":

        def late() -> None:
            time.sleep(0.3)
            print("thread done", flush=True)

        threading.Thread(target=late).start()
    sys.exit(code)


if __name__ == "__main__":
    main()
