"""Developer tools that are not part of the served package (nothing under app/ imports them)."""
