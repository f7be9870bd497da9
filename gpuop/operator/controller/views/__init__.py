"""Read-only views: what the caches and stored objects say, derived without I/O (no
REST client, work queue or Event recorder)."""
