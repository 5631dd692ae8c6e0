"""Pytest's root: the fixtures shared by tests/ and research/tests/ are registered once, so a session
builds each tiny bundle once for both trees."""

pytest_plugins = ["tests.support.fixtures"]
