"""Task kinds, one folder each (shell, agent, teammate, remote, dream, monitor), and the
interface the leader runs them through (kinds)."""
