"""Training text, its split, and a resumable batch order.

Sources (:func:`load_text`):

- default: the text of Python's own documentation topics (``pydoc_data.topics``, ~465 KB, in every CPython install);
- ``stdlib``: the source of Python's standard library (every ``*.py`` under ``sysconfig``'s stdlib path, sorted; about
  30 MB) — a larger offline corpus for model comparisons on machines that cannot download one;
- a path to a UTF-8 text file;
- ``hf:NAME[:CONFIG]``: a Hugging Face dataset (the ``datasets`` package: ``pip install 'lightning-attention[data]'``).

Batches are non-overlapping windows of ``context + 1`` tokens. Each epoch visits the windows of the training split
in a random order drawn from ``seed + epoch``; every epoch after the first also shifts all window boundaries by an
offset in ``[0, context)`` drawn from the same generator, so text seen again is cut at other places (a model cannot
learn the fixed windows by heart; the first epoch starts at token 0, so a run shorter than an epoch is unaffected).
The loader's whole state is ``(epoch, index)``, so a resumed run sees exactly the batches the uninterrupted run would
have seen. Under DDP every rank takes its own slice of each global batch.
"""

from dataclasses import dataclass

import torch

from lightning_attention.train.errors import UserError


def load_text(source: str | None = None, *, text_field: str = "text", split: str = "train",
              max_chars: int | None = None) -> str:
    """The training text of ``source`` (``None`` / "pydoc": Python's documentation topics; "stdlib"; a file path;
    "hf:NAME[:CONFIG]"), optionally truncated to ``max_chars``."""
    if source is None or source == "pydoc":
        import pydoc_data.topics

        topics = pydoc_data.topics.topics
        text = "\n\n".join(topics[name] for name in sorted(topics))
    elif source == "stdlib":
        import pathlib
        import sysconfig

        root = pathlib.Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))
        text = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    elif source.startswith("hf:"):
        try:
            import datasets
        except ImportError:
            raise UserError("--data hf:NAME needs the `datasets` package: "
                            "pip install 'lightning-attention[data]'") from None
        name, _, config = source[3:].partition(":")
        ds = datasets.load_dataset(name, config or None, split=split, streaming=True)
        parts, total = [], 0
        for row in ds:
            parts.append(row[text_field])
            total += len(parts[-1])
            if max_chars is not None and total >= max_chars:
                break
        text = "\n\n".join(parts)
    else:
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise UserError(f"--data {source}: {e.strerror or e} (give a UTF-8 text file, stdlib or hf:NAME)") from None
    if max_chars is not None:
        text = text[:max_chars]
    if not text:
        raise UserError(f"the training text from {source or 'pydoc_data.topics'} is empty")
    return text


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """Splits ``text`` into (train, validation) characters; validation is the tail (a tokenizer trained on the
    training part never sees it)."""
    if not 0 < val_fraction < 1:
        raise UserError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    n_val = max(1, int(len(text) * val_fraction))
    return text[:-n_val], text[-n_val:]


def check_split(train_tokens, val_tokens, context: int) -> None:
    """Both splits must hold at least one window of ``context + 1`` tokens."""
    if len(train_tokens) < context + 1 or len(val_tokens) < context + 1:
        raise UserError(f"text too short: {len(train_tokens)} training and {len(val_tokens)} validation tokens "
                         f"for windows of context {context} + 1 (use more text, a shorter --context or another "
                         f"--val-fraction)")


@dataclass
class LoaderState:
    epoch: int = 0
    index: int = 0  # next window (in the epoch's order) of the next global batch


@dataclass(eq=False, repr=False)  # not compared or printed: it holds the whole token tensor
class WindowLoader:
    """Random non-overlapping windows, their boundaries shifted every epoch, resumable.

    Args:
        tokens: ``[N]`` int token ids of the training split.
        context: tokens per training sequence (a window has ``context + 1``: inputs and shifted targets).
        batch_size: sequences per rank per step; rank, world_size: this process's share of a global batch.
        seed: each epoch's window offset and permutation are drawn from ``seed + epoch``.

    ``next_batch() -> [batch_size, context + 1]`` int64.
    """

    tokens: torch.Tensor
    context: int
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1

    def __post_init__(self):
        self.num_windows = (len(self.tokens) - 1) // self.context
        self.global_batch = self.batch_size * self.world_size
        if self.num_windows < self.global_batch:
            raise ValueError(
                f"{self.num_windows} windows of {self.context} tokens cannot fill a global batch of "
                f"{self.global_batch}"
            )
        self.state = LoaderState()
        self._layout_epoch, self._offset, self._order = -1, 0, None

    def epoch_layout(self, epoch: int) -> tuple[int, torch.Tensor]:
        """``(offset, order)`` of ``epoch``: the first window starts at token ``offset``, and ``order [windows]`` is
        the permutation in which the epoch visits its windows."""
        g = torch.Generator().manual_seed(self.seed + epoch)
        offset = int(torch.randint(self.context, (1,), generator=g)) if epoch > 0 else 0
        windows = (len(self.tokens) - 1 - offset) // self.context
        if windows < self.global_batch:  # a text of barely one global batch: keep the boundaries rather than stop
            offset, windows = 0, self.num_windows
        return offset, torch.randperm(windows, generator=g)

    def _layout(self) -> tuple[int, torch.Tensor]:
        if self._layout_epoch != self.state.epoch:
            self._offset, self._order = self.epoch_layout(self.state.epoch)
            self._layout_epoch = self.state.epoch
        return self._offset, self._order

    def next_batch(self) -> torch.Tensor:
        _, order = self._layout()
        if self.state.index + self.global_batch > len(order):  # drop the ragged end of an epoch
            self.state = LoaderState(self.state.epoch + 1, 0)
        offset, order = self._layout()
        lo = self.state.index + self.rank * self.batch_size
        starts = offset + order[lo : lo + self.batch_size] * self.context
        self.state.index += self.global_batch
        offsets = torch.arange(self.context + 1)
        return self.tokens[starts[:, None] + offsets[None, :]].long()

    def state_dict(self) -> dict:
        return {"epoch": self.state.epoch, "index": self.state.index}

    def load_state_dict(self, d: dict) -> None:
        self.state = LoaderState(int(d["epoch"]), int(d["index"]))


def validation_batches(tokens, context: int, batch_size: int, max_batches: int, rank: int = 0, world_size: int = 1):
    """Fixed validation windows (the first ``max_batches · batch_size · world`` of the split), this rank's share.

    Returns a list of ``[b, context + 1]`` int64 tensors (the last may be smaller; possibly empty on some ranks).
    """
    n = min((len(tokens) - 1) // context, max_batches * batch_size * world_size)
    mine = list(range(rank, n, world_size))
    offsets = torch.arange(context + 1)
    out = []
    for i in range(0, len(mine), batch_size):
        starts = torch.tensor(mine[i : i + batch_size]) * context
        out.append(tokens[starts[:, None] + offsets[None, :]].long())
    return out
