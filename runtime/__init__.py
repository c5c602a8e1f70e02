"""Plumbing the stages run on: artifacts, process pools, progress, failpoints, memory, the stage wrapper, isolation."""
