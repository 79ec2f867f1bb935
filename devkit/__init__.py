"""Shared by tests, benches and tools (never imported by the nodes): the trained small face model lives here."""
