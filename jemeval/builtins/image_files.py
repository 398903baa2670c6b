"""Which entries of an image folder are read as images: regular files, and links to files inside it, once.

torchvision's walk followed every link: a link back into the folder (``test/a/loop -> ..``) listed
the split's images again and again (18 images counted as 738, other classes' images labelled
``a``), and a FIFO named ``x.png`` blocked the first read for ever. Here a folder is walked without
entering links to folders (``os.walk(followlinks=False)``, as :func:`jemeval.provenance.content_sha256`
walks it), and an entry with an image suffix is read when it is

* a regular file, or
* a link whose target is a regular file inside the folder walked (a class folder, or a flat folder)
  that no other entry reads already: a file and a link to it are one image, read once.

Everything else with an image suffix is left out and counted by why (:data:`REASONS`): a FIFO,
socket or device, a dangling link, a link leading out of the folder. Links to folders are counted
too, whatever their name. :func:`skipped_note` says it in one line; nothing is left out silently.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

#: the file names read as images (flat and class folders alike; torchvision's ImageFolder took .ppm
#: and .pgm but not .gif)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")

#: why an entry is not read, as the note says it
REASONS = {
    "special": "not a regular file (a FIFO, socket or device)",
    "dangling": "a link to nothing",
    "outside": "a link out of its folder",
    "folder_link": "a link to a folder (not entered)",
    "duplicate": "a link to a file read already",
}


@dataclass
class Listing:
    """The image files of a folder, in sorted walk order, and the entries left out, by reason."""

    files: list[Path] = field(default_factory=list)
    skipped: dict[str, list[Path]] = field(default_factory=dict)

    def skip(self, reason: str, path: Path) -> None:
        self.skipped.setdefault(reason, []).append(path)

    def extend(self, other: Listing) -> None:
        self.files += other.files
        for reason, paths in other.skipped.items():
            self.skipped.setdefault(reason, []).extend(paths)


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def list_images(folder: Path, *, recursive: bool) -> Listing:
    """The images of ``folder`` (and of its sub-folders with ``recursive``; links to folders are
    never entered), sorted as torchvision's ImageFolder sorts them: by folder, then by name. Entries
    are read with ``os.scandir``: a regular file costs no system call beyond its folder's listing."""
    root = os.path.realpath(folder)
    listing, kept, links = Listing(), {}, []
    for where in sorted(_folders(str(folder), recursive, listing), key=lambda f: f[0]):
        device, entries = where[1], where[2]
        for entry in entries:
            if entry.is_symlink():
                links.append(entry)
                kept[entry.path] = None  # decided below, after the files
            elif entry.is_file(follow_symlinks=False):
                kept[entry.path] = (device, entry.inode())
            else:
                listing.skip("special", Path(entry.path))
    seen = {identity for identity in kept.values() if identity is not None}
    for entry in links:  # a file and a link to it keep the file
        reason, identity = _link(entry.path, root)
        if reason is None and identity in seen:
            reason = "duplicate"
        if reason is None:
            seen.add(identity)
            kept[entry.path] = identity
        else:
            listing.skip(reason, Path(entry.path))
            del kept[entry.path]
    listing.files = [Path(p) for p in kept]
    return listing


def _folders(top: str, recursive: bool, listing: Listing) -> list[tuple[str, int, list[os.DirEntry]]]:
    """(folder, its device, its entries with an image suffix sorted by name) for ``top`` and, with
    ``recursive``, every real sub-folder (as ``os.walk(followlinks=False)``: an unreadable folder is
    passed over); links to folders are counted in ``listing``, not entered."""
    found, stack = [], [top]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
            device = os.stat(path).st_dev
        except OSError:
            continue
        images = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if recursive:
                    stack.append(entry.path)
            elif entry.is_symlink() and entry.is_dir():
                listing.skip("folder_link", Path(entry.path))
            elif is_image_name(entry.name):
                images.append(entry)
        found.append((path, device, sorted(images, key=lambda e: e.name)))
        if not recursive:
            break
    return found


def _link(path: str, root: str) -> tuple[str | None, tuple[int, int] | None]:
    """(why the link ``path`` is not read, or None; the (device, inode) of the file it reads)."""
    try:
        st = os.stat(path)
    except OSError:
        return "dangling", None
    if stat.S_ISDIR(st.st_mode):
        return "folder_link", None
    if not stat.S_ISREG(st.st_mode):
        return "special", None
    if not os.path.realpath(path).startswith(root + os.sep):
        return "outside", None
    return None, (st.st_dev, st.st_ino)


def skipped_note(listing: Listing, where: str) -> str | None:
    """One line saying what ``listing`` left out of ``where`` and why, with the first of each; None
    when nothing was."""
    if not listing.skipped:
        return None
    parts = [f"{len(paths)} {REASONS[reason]} ({str(paths[0])!r}{', ...' if len(paths) > 1 else ''})"
             for reason, paths in listing.skipped.items()]
    total = sum(len(paths) for paths in listing.skipped.values())
    return (f"{where}: {total} entr{'y' if total == 1 else 'ies'} not read as images: {'; '.join(parts)}; an image "
            "folder reads regular files and links to files inside it, once each (docs/data.md)")
