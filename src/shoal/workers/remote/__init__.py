"""`remote_agent` tasks: work run as Ray Jobs on a cluster (spec, packing, the Jobs client,
the node-side job, verdicts)."""
