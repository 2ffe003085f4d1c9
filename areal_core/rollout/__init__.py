"""Rollout plane: staleness manager, asynchronous controller, workflows, reward runner."""
