"""Every path linlm writes, under one rule: write only what is free or linlm's own, remove only what linlm wrote.

**The record.** A directory that linlm writes into holds a ledger, ``.linlm-files.json``, that names the files
linlm wrote there, each with its size, modification time and sha256 (an append-only log: the sha256 of its first
bytes), and says whether linlm made the directory itself, under which name. Nothing is ever found by its name
alone: a file is *linlm's* when the ledger of its directory lists it and it still is what linlm wrote (same size,
and the same modification time or the same sha256, so a copied tree stays linlm's and an edited file does not);
a directory is linlm's when its own ledger says linlm made it under the name it has now (a directory the user
renamed or copied to a new name, ``cp -r step_100 best_keep``, is the user's). The ledger, the ``.lock`` file and
linlm's temporary files (``.NAME.<32 hex>.tmp``) are linlm's bookkeeping.

**Before any work** a command checks every path it will write (:func:`check_file`, :func:`check_dir`): a path is
free when nothing is there and its nearest existing ancestor is a directory that accepts a new file; an existing
file must be linlm's; an existing directory must be empty or one linlm has written into. A refusal is one line
(:class:`OutputError`, exit 2) and changes nothing on disk.

**Writing** (:func:`write_bytes`, :func:`write_json`, :func:`write_text`, :func:`save_figure`, :func:`write_via`):
into a temporary file beside the target, fsynced, renamed over it, the directory fsynced, then the ledger updated
under a lock on the ledger itself (several processes may write into one directory). Each write checks the target
again, so a user's file that appeared since the first check is refused, never replaced. An OSError (disk full,
read-only, a path under a file) is a one-line :class:`~linlm.errors.StorageError`; the old file stays whole.

**Removing** (:func:`remove_tree`, :func:`remove_file`): only the files the ledgers list, and the directories
linlm made once they are empty. A user's file or folder anywhere in the tree is kept. Before anything is removed,
every directory of the tree that holds a lock is locked here (another live process holding one refuses the
removal), and the kept paths are checked against what the new run will write (``blocks``): one that is in the way
refuses the command. :func:`check_removal` makes those checks alone, changing nothing (no lock file written),
for a command's checks before any work.
"""

from linlm.exports import exports

_NAMES = {  # module: the names it gives this package
    "linlm.errors": ["OutputError"],
    "linlm.outputs.files": ("append_text check_dir check_file copy_file dumps figure_png json_default make_dir "
                            "remove_if_unused save_figure shown write_bytes write_json write_text write_via").split(),
    "linlm.outputs.ledger": ("LEDGER bookkeeping file_entry foreign_entries forget has_ledger owns_dir owns_file "
                             "read_ledger read_own_json record seal update_ledger").split(),
    "linlm.outputs.trees": ("Removal check_removal commit_dir discard plan_removal remove_file remove_tree "
                            "temp_dir_beside").split(),
}
__all__, __getattr__, __dir__ = exports(__name__, {name: module for module, names in _NAMES.items() for name in names})
