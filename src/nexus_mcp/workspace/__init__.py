"""The served folder: its files and paths (``files.py``), confinement of every path to it,
and the search over it (``search.py`` with the regex sandbox in a child process)."""
