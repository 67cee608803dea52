"""Built-in transport plugins."""
