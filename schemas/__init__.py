"""Contracts shared by every part of Inlet: Arrow schemas, settings, errors. Imports nothing of the project."""
