"""Files written whole: the one way the kit writes a file another process may read.

A reader (a launcher, torchrun's agent, ``distkit doctor``, a resumed run) must never see
half a file, and a full disk or a stop mid-write must leave no empty or cut file behind
that a reader would trust. So the content goes to ``<path>.<pid>.partial`` first, is
renamed over ``path`` in one step, and the partial file is removed whatever stops the write.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import IO, Callable, Iterator


def partial_path(path: str) -> str:
    """The temporary name ``path`` is written under (one per process: two ranks writing
    the same file never share a partial one)."""
    return f"{path}.{os.getpid()}.partial"


@contextmanager
def whole(path: str) -> Iterator[str]:
    """The partial name to write ``path``'s content under (for writers that take a file
    name: ``savefig``, a profiler's export); renamed to ``path`` when the block ends. Any
    error propagates, and no partial file is left behind."""
    partial = partial_path(path)
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        remove_quietly(partial)
        raise


def write_whole(path: str, write: Callable[[IO], None], *, binary: bool = False,
                durable: bool = False) -> str:
    """Call ``write(f)`` on a partial file, then rename it to ``path``; return ``path``.
    ``durable`` syncs the content to disk before the rename (checkpoints' companions and
    results, which must survive a machine's crash)."""
    with whole(path) as partial, open(partial, "wb" if binary else "w") as f:
        write(f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    return path


def write_text(path: str, text: str, **options) -> str:
    """``text`` in ``path``, written whole."""
    return write_whole(path, lambda f: f.write(text), **options)


def write_json(path: str, obj, **options) -> str:
    """``obj`` as JSON in ``path``, written whole (``json.dump``'s own keywords go through
    ``dump``)."""
    dump = options.pop("dump", {})
    return write_whole(path, lambda f: json.dump(obj, f, **dump), **options)


def write_json_quietly(path: str, obj) -> str | None:
    """``write_json``, or None where the disk refuses it (a failure record on a full disk:
    the reader falls back to what it has, and nothing half-written stays)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return write_json(path, obj)
    except OSError:
        return None


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it is there."""
    try:
        os.remove(path)
    except OSError:
        pass
