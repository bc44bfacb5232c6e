"""The training batch order: random windows whose boundaries move every epoch, resumable exactly."""

import torch

from lightning_attention.train.data import WindowLoader

CONTEXT = 10


def _loader(seed=3, n=1000):
    # token value = its position, so a window's first token is where it starts
    return WindowLoader(torch.arange(n), CONTEXT, batch_size=4, seed=seed)


def _epochs(loader, count) -> dict[int, list[int]]:
    """``{epoch: starts of its windows}`` over the first ``count`` epochs."""
    out: dict[int, list[int]] = {}
    while True:
        batch = loader.next_batch()  # an epoch rolls over before its first batch is taken
        if loader.state.epoch >= count:
            return out
        assert torch.equal(batch[:, 1:] - batch[:, :-1], torch.ones(4, CONTEXT, dtype=torch.long))  # contiguous
        out.setdefault(loader.state.epoch, []).extend(batch[:, 0].tolist())


def test_window_boundaries_move_every_epoch_after_the_first():
    epochs = _epochs(_loader(), 4)
    assert list(epochs) == [0, 1, 2, 3]
    residues = []
    for starts in epochs.values():
        assert len(set(starts)) == len(starts)  # no window twice in an epoch
        assert len({s % CONTEXT for s in starts}) == 1  # one offset per epoch, non-overlapping windows
        residues.append(starts[0] % CONTEXT)
    assert residues[0] == 0  # the first epoch starts at token 0, as before offsets existed
    assert any(r != 0 for r in residues[1:]), residues  # later epochs cut the text elsewhere


def test_the_first_epoch_keeps_its_order():
    loader = _loader()
    order = torch.randperm(99, generator=torch.Generator().manual_seed(3))
    assert loader.next_batch()[:, 0].tolist() == (order[:4] * CONTEXT).tolist()


def test_resume_in_a_shifted_epoch_sees_the_same_batches():
    loader = _loader()
    for _ in range(30):  # 24 batches per epoch: into the second epoch
        loader.next_batch()
    assert loader.state.epoch == 1
    state = loader.state_dict()
    expected = [loader.next_batch() for _ in range(40)]  # on into the third epoch
    resumed = _loader()
    resumed.load_state_dict(state)
    assert all(torch.equal(a, resumed.next_batch()) for a in expected)
