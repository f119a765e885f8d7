"""A training job as the core sees it: its spec and state, its nodes, its attempts."""
