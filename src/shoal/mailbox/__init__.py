"""Per-member maildir inboxes: store, schemas, watcher and router."""
