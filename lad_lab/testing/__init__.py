"""Test support shipped with the package: tiny random MLLMs with offline processors."""
