"""On-disk caches of derived data that is expensive to recompute, keyed by what it was derived from.

Each module owns one cache file format: written atomically, read without unpickling, and refused
(never silently replaced) when it was derived from something else. Evaluation code uses these
instead of writing files itself.
"""
