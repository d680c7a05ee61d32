"""Team files, members, colours and the shared task list."""
