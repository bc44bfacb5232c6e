"""The graph-replayed decode step (``config.decode_cuda_graphs``): ``generate()`` gives the tokens of the eager
forward in every decoding mode, with left padding, a cache handed in and caches taking turns; the step runs only
where it is exact; moving the model drops the graphs; the cache advances as the eager forward advances it.

On CPU the step is replayed by ``EagerReplay`` (the captured body run again from its own buffers, which is what makes
a graph replay exact); the GPU tests replay real CUDA graphs."""

import pytest
import torch

from lightning_attention.models.transnormer import cache_of
from lightning_attention.models.transnormer.cache import CACHE_FIELD
from lightning_attention.models.transnormer.decode_graph import CudaGraphReplay, EagerReplay, graphs_of
from tests.models.helpers import VARIANTS, left_pad, tiny_tnl
from tests.models.test_generation import MODES, generate


class CountingReplay(EagerReplay):
    """:class:`EagerReplay` that counts its replays in ``CountingReplay.replays``."""

    replays = 0

    def replay(self):
        type(self).replays += 1
        return super().replay()


def with_graphs(model, replay_cls=CountingReplay):
    """``model`` with ``decode_cuda_graphs`` on and its steps replayed by ``replay_cls``."""
    model.config.decode_cuda_graphs = True
    graphs_of(model).replay_cls = replay_cls
    CountingReplay.replays = 0
    return model


def decode_state(model, ids, **kwargs):
    """The cache and last logits ``[B, vocab]`` after a prefill of ``ids [B, T]``."""
    out = model(ids, use_cache=True, **kwargs)
    return cache_of(out), out.logits[:, -1]


@pytest.mark.parametrize("variant", ["tnl", "minimax", "tnl-paper-decay"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_generate_through_the_graph_step_equals_eager(variant, mode, padded):
    model = tiny_tnl(torch.float64, **VARIANTS[variant])
    ids = torch.randint(1, 256, (2, 9))
    kwargs = dict(MODES[mode])
    if padded:
        ids, mask = left_pad([ids[0].tolist(), ids[1, 4:].tolist()])
        kwargs["attention_mask"] = mask
    eager = generate(model, ids, **kwargs)
    graphed = generate(with_graphs(model), ids, **kwargs)
    assert CountingReplay.replays == 5  # every step after the prompt went through the step
    assert torch.equal(graphed, eager)


def test_learned_decay_and_float32_lrpe():
    model = tiny_tnl(torch.float64, learn_decay=True, lrpe_float32=True, linear_use_lrpe_list=[1, 1])
    ids = torch.randint(1, 256, (3, 7))
    eager = generate(model, ids, do_sample=False)
    assert torch.equal(generate(with_graphs(model), ids, do_sample=False), eager)
    assert CountingReplay.replays == 5


@torch.no_grad()
def test_caches_taking_turns_keep_their_own_states():
    """Two conversations stepping alternately through one captured step (batch 1 each) give what each gives alone,
    and the cache that is not bound holds its own copy of its states."""
    model = tiny_tnl(torch.float64)
    a_ids, b_ids = torch.randint(1, 256, (1, 6)), torch.randint(1, 256, (1, 11))
    reference = {}
    for name, ids in (("a", a_ids), ("b", b_ids)):
        cache, logits = decode_state(model, ids)
        steps = []
        for _ in range(4):
            token = logits.argmax(-1, keepdim=True)
            out = model(token, **{CACHE_FIELD: cache})
            logits = out.logits[:, -1]
            steps.append(logits)
        reference[name] = torch.stack(steps)
    with_graphs(model)
    caches, logits, steps = {}, {}, {"a": [], "b": []}
    for name, ids in (("a", a_ids), ("b", b_ids)):
        caches[name], logits[name] = decode_state(model, ids)
    for _ in range(4):
        for name in ("a", "b"):
            token = logits[name].argmax(-1, keepdim=True)
            logits[name] = model(token, **{CACHE_FIELD: caches[name]}).logits[:, -1]
            steps[name].append(logits[name])
    assert CountingReplay.replays == 8
    for name in ("a", "b"):
        assert torch.equal(torch.stack(steps[name]), reference[name])
    step = next(iter(graphs_of(model).steps.values()))
    assert all(s is t for s, t in zip(caches["b"].states, step.states))  # b stepped last: bound
    assert not any(s is t for s, t in zip(caches["a"].states, step.states))  # a holds copies


def test_generate_continues_a_cache_handed_in():
    model = tiny_tnl(torch.float64)
    ids = torch.randint(1, 256, (1, 12))
    eager = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    with_graphs(model)
    cache = cache_of(model(ids[:, :8], use_cache=True))
    out = model.generate(ids, max_new_tokens=4, do_sample=False, **{CACHE_FIELD: cache})
    assert torch.equal(out, eager)
    assert CountingReplay.replays == 3 and cache.get_seq_length() == 12 + 3


@pytest.mark.parametrize("explicit_positions", [False, True], ids=["cache-positions", "position_ids"])
@torch.no_grad()
def test_a_padded_decode_step_advances_the_cache_as_eager_does(explicit_positions):
    """A step whose new token is padding in one row (attention mask 0 there): that row's state and position stay,
    and logits, states and positions equal the eager forward's."""
    model = tiny_tnl(torch.float64)
    ids = torch.randint(1, 256, (2, 5))
    token = torch.randint(1, 256, (2, 1))
    mask = torch.tensor([[1] * 6, [1] * 5 + [0]])
    kwargs = {"attention_mask": mask}
    if explicit_positions:
        kwargs["position_ids"] = torch.tensor([[5], [7]])
    results = []
    for graphs in (False, True):
        model.config.decode_cuda_graphs = graphs
        if graphs:
            with_graphs(model)
        cache, _ = decode_state(model, ids)
        before = [s.clone() for s in cache.states]
        logits = model(token, **{CACHE_FIELD: cache}, **kwargs).logits
        results.append((logits, [s.clone() for s in cache.states], cache.positions.clone(), cache.seen_tokens))
        for s, b in zip(cache.states, before):
            assert torch.equal(s[1], b[1])  # the padded row's state is untouched
    assert CountingReplay.replays == 1
    (le, se, pe, ne), (lg, sg, pg, ng) = results
    assert torch.equal(lg[0], le[0])  # the padded row's output is unspecified, as in eager
    assert all(torch.equal(a, b) for a, b in zip(sg, se))
    assert torch.equal(pg, pe) and ng == ne


@torch.no_grad()
def test_the_step_runs_only_where_it_is_exact():
    ids = torch.randint(1, 256, (2, 6))
    token = torch.randint(1, 256, (2, 1))
    hybrid = with_graphs(tiny_tnl(torch.float64, **VARIANTS["hybrid"]))
    hybrid.generate(ids, max_new_tokens=3, do_sample=False)
    assert CountingReplay.replays == 0  # softmax layers grow their keys: eager
    model = with_graphs(tiny_tnl(torch.float64))
    cache, _ = decode_state(model, ids)
    with torch.enable_grad():
        model(token, **{CACHE_FIELD: cache})  # autograd: eager
    model(inputs_embeds=model.model.embed_tokens(token), **{CACHE_FIELD: cache})
    model(token, **{CACHE_FIELD: cache}, output_hidden_states=True)
    model(token, **{CACHE_FIELD: cache}, labels=token)
    model(torch.randint(1, 256, (2, 2)), **{CACHE_FIELD: cache})  # two new tokens
    model.train()
    model(token, **{CACHE_FIELD: cache})
    model.eval()
    assert CountingReplay.replays == 0
    model(token, **{CACHE_FIELD: cache})
    assert CountingReplay.replays == 1
    model.config.decode_cuda_graphs = False
    model(token, **{CACHE_FIELD: cache})
    assert CountingReplay.replays == 1


@torch.no_grad()
def test_moving_the_model_drops_its_graphs_and_the_cache_keeps_its_states():
    model = with_graphs(tiny_tnl(torch.float64))
    ids = torch.randint(1, 256, (1, 6))
    cache, logits = decode_state(model, ids)
    model(logits.argmax(-1, keepdim=True), **{CACHE_FIELD: cache})
    step = next(iter(graphs_of(model).steps.values()))
    assert all(s is t for s, t in zip(cache.states, step.states))
    values = [s.clone() for s in cache.states]
    model.to(torch.float32)
    assert not graphs_of(model).steps
    assert not any(s is t for s, t in zip(cache.states, step.states))
    assert all(torch.equal(s, v) for s, v in zip(cache.states, values))


def _gpu_model(dtype):
    return tiny_tnl(torch.float32, decoder_embed_dim=128, decoder_attention_heads=2, glu_dim=256,
                    linear_use_lrpe_list=[1, 0]).to(device="cuda", dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@torch.no_grad()
def test_cuda_graph_steps_equal_eager_steps(dtype):
    """Real CUDA graphs, teacher-forced: 12 decode steps of 3 rows (one left-padded) fed the same tokens through
    the replayed step and the eager forward give the same logits and leave the same states and positions."""
    model = _gpu_model(dtype)
    ids, mask = left_pad([list(range(1, 38)), list(range(5, 30)), list(range(9, 47))])
    ids, mask = ids.cuda(), mask.cuda()
    caches = {}
    for graphs in (False, True):
        model.config.decode_cuda_graphs = graphs
        if graphs:
            graphs_of(model).replay_cls = CudaGraphReplay
        caches[graphs], logits = decode_state(model, ids, attention_mask=mask)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for _ in range(12):
        token = logits.argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        outs = {}
        for graphs in (False, True):
            model.config.decode_cuda_graphs = graphs
            outs[graphs] = model(token, attention_mask=mask, **{CACHE_FIELD: caches[graphs]}).logits[:, -1]
        torch.testing.assert_close(outs[True], outs[False], **tol)
        logits = outs[False]
    steps = graphs_of(model).steps
    assert len(steps) == 1 and isinstance(next(iter(steps.values())).replay.__self__, CudaGraphReplay)
    for a, b in zip(caches[True].states, caches[False].states):
        torch.testing.assert_close(a, b, **tol)
    assert torch.equal(caches[True].positions, caches[False].positions)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_cuda_graph_generate_equals_eager(mode):
    """``generate()`` in float32 through real CUDA graphs: the tokens of the eager forward, twice (the second request
    replays the step captured by the first from a new cache)."""
    model = _gpu_model(torch.float32)
    ids = torch.randint(1, 256, (3, 37), device="cuda")
    kwargs = dict(MODES[mode], max_new_tokens=12, min_new_tokens=12)
    eager = model.generate(ids, **kwargs)
    model.config.decode_cuda_graphs = True
    graphs_of(model).replay_cls = CudaGraphReplay
    assert torch.equal(model.generate(ids, **kwargs), eager)
    assert torch.equal(model.generate(ids, **kwargs), eager)
    assert len(graphs_of(model).steps) == 1
