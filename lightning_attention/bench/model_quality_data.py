"""The tokenized corpus of a model-quality run: read once, shared by every run of the process.

The corpus folder is the one ``python -m lightning_attention.bench.corpus`` writes (``train.txt``, ``val.txt``,
``manifest.json``, optionally ``tokenizer-bpe<N>/``); its files are checked against the manifest's sha256 first.
The tokenizer is ``corpus`` (the folder's BPE, trained on its training split when the corpus was built: the same
tokenizer on every machine), ``bpe`` (trained here on the training split), ``bytes``, or a tokenizer folder.
"""

import dataclasses
import hashlib
import pathlib

import torch

from lightning_attention.bench.corpus import load_manifest
from lightning_attention.train.tokenizer import encode_corpus, resolve_tokenizer, token_byte_lengths


@dataclasses.dataclass
class QualityData:
    """``train [N]`` and ``val [M]`` token ids, ``byte_lengths [vocab]`` (UTF-8 bytes per token id)."""

    train: torch.Tensor
    val: torch.Tensor
    byte_lengths: torch.Tensor
    vocab_size: int
    corpus: dict  # what the JSON records: folder, sha256 and bytes of each split, sources and versions
    tokenizer: dict  # kind, vocabulary, sha256 of tokenizer.json, bytes per token of each split


def load_data(corpus_dir: pathlib.Path, tokenizer_spec: str = "corpus", vocab_size: int = 8192, log=print):
    """Reads, checks and tokenizes the corpus of ``corpus_dir`` (see the module docstring for ``tokenizer_spec``)."""
    corpus_dir = pathlib.Path(corpus_dir)
    manifest = load_manifest(corpus_dir)
    texts = {split: (corpus_dir / f"{split}.txt").read_text(encoding="utf-8") for split in ("train", "val")}
    spec = tokenizer_spec
    if spec == "corpus":
        record = manifest.get("tokenizer")
        if not record:
            raise FileNotFoundError(f"{corpus_dir} has no tokenizer: build the corpus with --bpe-vocab N, or pass "
                                    f"--tokenizer bpe|bytes|PATH")
        spec = str(corpus_dir / record["folder"])
    tokenizer = resolve_tokenizer(spec, train_text=texts["train"], vocab_size=vocab_size)
    # the serialised tokenizer's digest identifies it whichever way it came (a BPE trains deterministically)
    serialised = tokenizer.backend_tokenizer.to_str().encode("utf-8")
    info = {"spec": tokenizer_spec, "vocab_size": len(tokenizer), "sha256": hashlib.sha256(serialised).hexdigest()}
    ids = {}
    for split, text in texts.items():
        ids[split] = encode_corpus(tokenizer, text)
        info[f"{split}_tokens"] = len(ids[split])
        info[f"{split}_bytes_per_token"] = len(text.encode("utf-8")) / len(ids[split])
    log(f"corpus {corpus_dir}: {info['train_tokens']:,} training and {info['val_tokens']:,} validation tokens "
        f"({tokenizer_spec} tokenizer, {len(tokenizer)} ids, {info['train_bytes_per_token']:.2f} bytes/token)")
    corpus = {"folder": str(corpus_dir), "bytes": manifest["bytes"],
              "sha256": {name: meta["sha256"] for name, meta in manifest["files"].items()},
              "sources": [f"{s['source']} ({s['version']})" for s in manifest["sources"]]}
    return QualityData(ids["train"], ids["val"], token_byte_lengths(tokenizer), len(tokenizer), corpus, info)
