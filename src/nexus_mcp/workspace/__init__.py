"""The served folder: its file operations (``files.py``, on descriptors from
``descriptors.py``), caller paths by name (``paths.py``), confinement of every path to it
(``confinement.py``), the commit point a timeout cannot cross (``commits.py``), the
stand-ins of a replay (``replay.py``), and the search over it (``search.py`` with the regex
sandbox in a child process)."""
