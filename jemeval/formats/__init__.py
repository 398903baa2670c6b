"""Checkpoint formats: jemeval's own (native), foreign layouts, loading and converting."""
