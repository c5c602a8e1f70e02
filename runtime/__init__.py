"""Plumbing the stages run on: artifacts, process pools, progress, failpoints, memory, isolation, the stopwatch."""
