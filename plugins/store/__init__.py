"""Built-in store plugins."""
