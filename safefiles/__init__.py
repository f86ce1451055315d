"""Files opened and written as what they are expected to be: regular files, never through a symlink.

Below every other package of the project (it imports none of them): `index`, `paging` and `tieredkv`
open and write their own files through it.
"""

from .atomic_file import AtomicFile, check_target, fsync_dir, remove_stale_temps
from .regular_file import UnsafeFileError, open_regular, read_regular

__all__ = ["AtomicFile", "UnsafeFileError", "check_target", "fsync_dir", "open_regular", "read_regular",
           "remove_stale_temps"]
