"""Where artifacts live: the content-addressed cache (locked, verified), bundles (one zip file with a
manifest) and the crash-safe file writes both rely on. Standard library (plus filelock for the cache's
writers): the runtime reads both."""
