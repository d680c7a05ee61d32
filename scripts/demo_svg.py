"""Record `shoal demo` in a real terminal and write the screen as an SVG (docs/demo.svg).

The demo runs in a pane of a tmux server of its own (its own socket), on a copy of shoal's
`src/` in a temporary directory, with a SHOAL_HOME of its own; when it ends the pane's whole
history is captured with its colours (`capture-pane -e`) and rendered by rich's SVG export.
Usage: `python3 scripts/demo_svg.py [OUT.svg] [--width N]`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120.0


def tmux(sock: str, *args: str) -> str:
    """Run one tmux command on the recording's own server and return what it printed."""
    out = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=True)
    return out.stdout


def record(width: int) -> str:
    """Run the demo in a fresh pane and return the pane's history with its escape codes."""
    sock = f"shoal-demo-svg-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="shoal-demo-") as tmp:
        work, home, done = Path(tmp) / "project", Path(tmp) / "home", Path(tmp) / "done"
        shutil.copytree(
            ROOT / "src", work, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
        demo = shlex.join([sys.executable, "-m", "shoal", "demo", "--backend", "process"])
        command = (
            f"cd {shlex.quote(str(work))} && printf '$ shoal demo\\n' && "
            f"SHOAL_HOME={shlex.quote(str(home))} {demo}; echo $? > {done}.part; "
            f"mv {done}.part {done}; exec sleep 600"
        )
        try:
            tmux(sock, "new-session", "-d", "-x", str(width), "-y", "50", "sh", "-c", command)
            tmux(sock, "set-option", "-g", "history-limit", "5000")
            deadline = time.monotonic() + TIMEOUT_S
            while not done.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"demo_svg: the demo did not end within {TIMEOUT_S:.0f} s")
                time.sleep(0.2)
            if done.read_text().strip() != "0":
                raise SystemExit(f"demo_svg: the demo exited {done.read_text().strip()}")
            return tmux(sock, "capture-pane", "-p", "-e", "-J", "-S", "-", "-E", "-")
        finally:
            subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def main() -> None:
    """Record the demo and write the SVG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(ROOT / "docs" / "demo.svg"))
    parser.add_argument("--width", type=int, default=100)
    args = parser.parse_args()
    screen = record(args.width).rstrip() + "\n"
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=args.width, force_terminal=True, file=sink)
        console.print(Text.from_ansi(screen))
        console.save_svg(args.out, title="shoal demo")
    print(f"wrote {args.out} ({len(screen.splitlines())} lines)")


if __name__ == "__main__":
    main()
