"""Worker backends: process, tmux, iTerm2 and in-process."""
