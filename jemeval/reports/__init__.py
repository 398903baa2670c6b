"""Reports: several models evaluated side by side (``jemeval report``, :func:`jemeval.report`).

A layer above evaluation and plots: it runs the evaluation functions, caches their Results in the
report folder and writes the page (markdown, HTML, JSON, figures). ``build.py`` is the entry point.
"""
