"""Test support code shared by the whole suite."""
