"""Application side: write batches, the Agent, relaxed stores, the sidecar, the CLI."""
