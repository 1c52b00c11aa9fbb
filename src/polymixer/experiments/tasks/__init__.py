"""Tasks: what the shared training loop runs for each model family, and their command-line entry points."""
