"""Progress bars: tqdm when it is installed, else one printed line per step (the GPU machine may lack tqdm)."""

import sys

try:
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - exercised only where tqdm is missing
    _tqdm = None


class _Lines:
    """The subset of tqdm used here: iteration, update, set_postfix_str, write, context manager."""

    def __init__(self, iterable=None, total=None, desc="", unit="it", **_):
        self.iterable, self.desc, self.unit, self.n, self.postfix = iterable, desc, unit, 0, ""
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int = 1) -> None:
        self.n += n
        print(
            f"{self.desc}: {self.n}/{self.total if self.total is not None else '?'} {self.unit} {self.postfix}",
            file=sys.stderr,
            flush=True,
        )

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    @staticmethod
    def write(text: str) -> None:
        print(text, file=sys.stderr, flush=True)


def progress(iterable=None, **kwargs):
    """``tqdm(iterable, **kwargs)`` (dynamic width), or the line printer when tqdm is missing."""
    if _tqdm is not None:
        return _tqdm(iterable, dynamic_ncols=True, **kwargs)
    return _Lines(iterable, **kwargs)


def write(text: str) -> None:
    """Print without breaking a running bar."""
    (_tqdm.write if _tqdm is not None else _Lines.write)(text)
