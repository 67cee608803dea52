"""Built-in allocate plugins."""
