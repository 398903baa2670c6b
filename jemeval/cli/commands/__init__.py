"""One module per command; each defines ``cli`` (a click command). Discovered lazily."""
