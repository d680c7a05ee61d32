"""The first process of a tmux pane that has secrets: it reads them from a file, then execs.

tmux takes a pane's environment on its command line (`new-window -e KEY=VALUE`), and the
first tmux client's command line stays the server's for good: anyone on the machine reads it
with `ps`. So secret variables (API keys, $SHOAL_RAY_TOKEN) are written instead to a 0600
file in the team's 0700 directory, named here by $SHOAL_PANE_SECRETS; this script reads it
(refusing a link or another user's file), removes it, puts the variables into its own
environment and execs the pane's real command, which so keeps the pane's pid.

Stdlib only, and no import of shoal: run by path with `python -S -I`, in a few milliseconds.
"""

import json
import os
import stat
import sys

ENV = "SHOAL_PANE_SECRETS"


def load(path: str) -> dict[str, str]:
    """The variables in `path` (a JSON object of strings), which is removed once read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise OSError(f"{path} is not a file of this user")
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
        os.unlink(path)
    values = json.loads(data)
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds no variables")
    return {str(k): str(v) for k, v in values.items()}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: pane_secrets ARGV...", file=sys.stderr)
        return 2
    path = os.environ.pop(ENV, "")
    if path:
        try:
            os.environ.update(load(path))
        except (OSError, ValueError) as exc:
            # (loud, in the pane: the teammate starts without them)
            print(f"shoal: cannot read the pane's secret variables: {exc}", file=sys.stderr)
    try:
        os.execvp(argv[1], argv[1:])
    except OSError as exc:
        print(f"shoal: cannot start {argv[1]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
