"""Tokenizers: the byte tokenizer keeps id == byte value, a byte-level BPE trains on the training split only and is
saved with the model, token ids past 255 are stored as int32, bits per byte are exact, and the saved folder works with
pipeline("text-generation") and TextStreamer."""

import contextlib
import io
import math
import os
from types import SimpleNamespace

import pytest
import torch
from tokenizers import pre_tokenizers

from lightning_attention.cli import main
from lightning_attention.train import tokenizer as tok
from lightning_attention.train.data import load_text, split_text
from lightning_attention.train.trainer import evaluate

TEXT = "def f(x):\n    return x  # naïve ✓ 🦊\x00 tabs\tand\r\nCRLF — ünïcödé " * 3


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    t = tok.byte_tokenizer()
    assert len(t) == 256 and tok.is_byte_tokenizer(t)
    assert t(TEXT)["input_ids"] == list(TEXT.encode("utf-8"))
    assert t.decode(list(TEXT.encode("utf-8"))) == TEXT
    assert t.decode([0xF0, 0x9F]) == "\ufffd"  # an incomplete character decodes to the replacement character
    assert tok.encode_corpus(t, TEXT).tolist() == t(TEXT)["input_ids"]  # the fast path gives the same ids
    assert tok.encode_corpus(t, TEXT).dtype == torch.uint8
    assert set(tok.BYTE_TO_CHAR.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert tok.token_byte_lengths(t).tolist() == [1] * 256


def test_bpe_round_trips_unseen_text_and_counts_bytes():
    t = tok.train_bpe_tokenizer(load_text(max_chars=100_000), vocab_size=400)
    assert len(t) == 400 and not tok.is_byte_tokenizer(t)
    ids = t(TEXT)["input_ids"]
    assert len(ids) < len(TEXT.encode("utf-8")) and t.decode(ids) == TEXT
    corpus = tok.encode_corpus(t, TEXT)
    assert corpus.dtype == torch.int32 and corpus.tolist() == ids
    assert int(tok.token_byte_lengths(t)[corpus.long()].sum()) == len(TEXT.encode("utf-8"))
    with pytest.raises(tok.UserError, match="vocab_size >= 256"):
        tok.train_bpe_tokenizer(TEXT, vocab_size=100)


def test_bits_per_byte_of_a_uniform_model():
    """A model that predicts every token with probability 1/V: nats/token = ln V, bits/byte = ln V · tokens / (ln 2 ·
    bytes of the target tokens)."""
    vocab = 7
    lengths = torch.tensor([1, 2, 3, 1, 4, 1, 2])

    def model(inputs, **kwargs):
        return SimpleNamespace(logits=torch.zeros(*inputs.shape, vocab))

    model.training, model.eval, model.train = False, lambda: None, lambda mode: None
    batches = [torch.randint(0, vocab, (3, 9)) for _ in range(2)]
    info = SimpleNamespace(enabled=False)
    nats, bpb = evaluate(model, batches, "cpu", contextlib.nullcontext(), info, lengths)
    tokens = sum(b[:, 1:].numel() for b in batches)
    n_bytes = sum(int(lengths[b[:, 1:]].sum()) for b in batches)
    assert nats == pytest.approx(math.log(vocab), rel=1e-6)
    assert bpb == pytest.approx(math.log(vocab) * tokens / (math.log(2) * n_bytes), rel=1e-6)


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """``train --tokenizer bpe`` (vocabulary 300), recording the text the BPE was trained on."""
    seen = []
    real = tok.train_bpe_tokenizer

    def spy(text, vocab_size, **kwargs):
        seen.append(text)
        return real(text, vocab_size, **kwargs)

    tok.train_bpe_tokenizer = spy
    try:
        out = str(tmp_path_factory.mktemp("bpe") / "run")
        assert main(["train", "--smoke", "--no-progress", "--steps", "2", "--tokenizer", "bpe", "--vocab-size", "300",
                     "--out", out]) == 0
    finally:
        tok.train_bpe_tokenizer = real
    return out, seen


def test_train_with_a_bpe_saves_it_with_the_model(bpe_run):
    from transformers import AutoConfig, AutoTokenizer

    out, seen = bpe_run
    train_text, val_text = split_text(load_text(max_chars=60_000), 0.05)
    assert seen == [train_text]  # trained on the training split only, never on the validation text
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 300 and AutoConfig.from_pretrained(out).vocab_size == 300
    assert tokenizer.decode(tokenizer(val_text)["input_ids"]) == val_text


def test_train_with_a_tokenizer_folder(bpe_run, tmp_path):
    out, _ = bpe_run
    again = str(tmp_path / "again")
    assert main(["train", "--smoke", "--no-progress", "--steps", "1", "--tokenizer", out, "--out", again]) == 0
    assert os.path.isfile(os.path.join(again, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer.json")) as a, open(os.path.join(again, "tokenizer.json")) as b:
        assert a.read() == b.read()


def test_pipeline_and_text_streamer_on_a_trained_folder(bpe_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer, pipeline

    out, _ = bpe_run
    generator = pipeline("text-generation", model=out)
    text = generator("def main():", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert text.startswith("def main():") and len(text) > len("def main():")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("def main():", return_tensors="pt")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ids = model.generate(**inputs, max_new_tokens=8, do_sample=False, streamer=TextStreamer(tokenizer,
                                                                                             skip_prompt=True))
    assert printed.getvalue().rstrip("\n") == tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:])
    assert text == tokenizer.decode(ids[0])  # the pipeline generated the same greedy continuation
