"""The leader: task registry, poll loop, session and control channel."""
