"""Terminal views of a swarm."""
