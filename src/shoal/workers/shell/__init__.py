"""`local_bash` tasks: a process group per task, its output straight into its file."""
