"""`remote_agent` tasks: work run as Ray Jobs on a cluster (the request: spec; the packed work
tree: packing; the Jobs client: ray_jobs; the call chains: calls; the job's markers and
verdicts: verdicts; re-attaching: sidecar; the kind)."""
