"""Built-in plugins. Each module implements the same hooks a third-party plugin would."""
