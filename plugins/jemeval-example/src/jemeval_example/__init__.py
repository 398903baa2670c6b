"""The jemeval tutorial plugin (see plugin.py)."""
__version__ = "0.1.0"
