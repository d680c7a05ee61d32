"""`shoal demo`: the offline demos (a scripted swarm, and coordinator mode), above the leader."""
