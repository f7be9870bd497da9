"""Base: work-queue keys, pass results, configuration, memos and the caches every floor
may use."""
