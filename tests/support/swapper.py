"""A local attacker for race tests: swaps a folder and a link to outside, bounded."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

MAX_SWAPS = 200_000
MAX_SECONDS = 30.0


class Swapper:
    """Swaps ``folder`` between a real folder and a link to ``outside`` until stopped."""

    def __init__(self, folder: Path, outside: Path) -> None:
        self.folder, self.outside = folder, outside
        self.spare = folder.with_name(folder.name + ".real")
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + MAX_SECONDS  # bounded even if nobody stops it
        while not self._stop.is_set() and time.monotonic() < deadline and self.swaps < MAX_SWAPS:
            os.rename(self.folder, self.spare)
            os.symlink(self.outside, self.folder)
            os.unlink(self.folder)
            os.rename(self.spare, self.folder)
            self.swaps += 1

    def __enter__(self) -> Swapper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
