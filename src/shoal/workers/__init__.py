"""Task kinds, one folder each (shell, agent, teammate, remote, dream, monitor), the
interface the leader runs them through (kinds), and the base the process kinds share
(process_kind)."""
