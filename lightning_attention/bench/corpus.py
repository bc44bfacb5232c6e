"""A natural-language corpus from documentation installed on this machine, split by document, with a manifest.

    python -m lightning_attention.bench.corpus --out .corpus      # the default sources: 29 MB, + an 8,192 BPE (2 min)
    python -m lightning_attention.bench.corpus --out .corpus --sources python-docs,numpy --bpe-vocab 0

Writes ``train.txt`` and ``val.txt`` (UTF-8), ``manifest.json`` (sources and their versions; per source the
documents read, the characters left once markup and code blocks went, those dropped as code-like or duplicate, the
documents and characters kept per split; the sha256 of every file, the settings, the build time) and, with
``--bpe-vocab N``, a byte-level BPE of N tokens trained on ``train.txt`` only (``tokenizer-bpe<N>/``, a transformers
tokenizer folder). Model-quality runs read the folder (``lightning-attention bench model-quality --corpus
.corpus``); ``train --data .corpus/train.txt`` takes the text too.

How the text is made, in this order (every step deterministic: the same package versions give the same bytes):

1. each source (:mod:`.corpus_sources`) yields documents in a fixed order, cleaned to prose (:mod:`.corpus_prose`);
2. every paragraph of at least :data:`DEDUP_MIN_CHARS` characters is kept once across the whole corpus (its first
   occurrence in source order), a shorter one once per document: docstrings copied between modules (transformers
   copies whole argument lists) and repeated API descriptions count once;
3. documents left with fewer than :data:`MIN_DOCUMENT_CHARS` characters are dropped;
4. a document goes to validation when the sha256 of its name falls in the first ``val_fraction`` of the hash range:
   the split is by whole document (no window of validation text has a near copy in training) and does not move when
   another source is added.

Documents are separated by two blank lines, paragraphs by one.
"""

import argparse
import hashlib
import json
import pathlib
import platform
import re
import sys
import time

from lightning_attention.bench.corpus_prose import prose_paragraphs
from lightning_attention.bench.corpus_sources import BOTOCORE_API, PYTHON_DOCS, PYTHON_STDLIB, documents, source_version
from lightning_attention.train.checkpoint import sha256_of

# the default sources, in the order their documents enter the corpus (the first copy of a paragraph wins)
DEFAULT_SOURCES = (PYTHON_DOCS, PYTHON_STDLIB, "numpy", "scipy", "sympy", "networkx", "matplotlib", "torch",
                   "transformers", "huggingface_hub", BOTOCORE_API)
DEDUP_MIN_CHARS = 64
MIN_DOCUMENT_CHARS = 256
DOCUMENT_SEPARATOR = "\n\n\n"
PARAGRAPH_SEPARATOR = "\n\n"
MANIFEST_FORMAT = 1


def is_validation(name: str, val_fraction: float) -> bool:
    """Whether document ``name`` belongs to the validation split (a fixed function of the name)."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:12], 16) < val_fraction * 16**12


def _key(paragraph: str) -> bytes:
    return hashlib.sha1(" ".join(paragraph.split()).encode("utf-8")).digest()


def build_corpus(out: pathlib.Path, sources=DEFAULT_SOURCES, *, val_fraction: float = 0.05, bpe_vocab: int = 8192,
                 command: str | None = None, log=print) -> dict:
    """Builds the corpus into ``out`` (created; earlier files replaced) and returns its manifest (``command``: the
    command line to record in it)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    start = time.perf_counter()
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[bytes] = set()
    splits = {"train": [], "val": []}
    records = []
    for source in sources:
        t0 = time.perf_counter()
        record = {"source": source, "version": source_version(source), "documents_read": 0, "chars_cleaned": 0,
                  "chars_not_prose": 0, "chars_duplicate": 0, "documents": {"train": 0, "val": 0},
                  "chars": {"train": 0, "val": 0}}
        for name, text in documents(source):
            record["documents_read"] += 1
            record["chars_cleaned"] += len(text)  # after markup and code blocks went (corpus_prose)
            paragraphs, not_prose = prose_paragraphs(text)
            record["chars_not_prose"] += not_prose
            local: set[bytes] = set()
            kept = []
            for paragraph in paragraphs:
                key = _key(paragraph)
                pool = seen if len(paragraph) >= DEDUP_MIN_CHARS else local
                if key in pool:
                    record["chars_duplicate"] += len(paragraph)
                    continue
                pool.add(key)
                kept.append(paragraph)
            body = PARAGRAPH_SEPARATOR.join(kept)
            if len(body) < MIN_DOCUMENT_CHARS:
                continue
            split = "val" if is_validation(name, val_fraction) else "train"
            splits[split].append(body)
            record["documents"][split] += 1
            record["chars"][split] += len(body)
        record["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"{source} ({record['version']}): {record['documents_read']} documents read, "
            f"{record['documents']['train']} + {record['documents']['val']} kept, "
            f"{(record['chars']['train'] + record['chars']['val']) / 1e6:.2f} M characters ({record['seconds']} s)")
        records.append(record)

    files = {}
    for split, docs in splits.items():
        if not docs:
            raise ValueError(f"the {split} split is empty: use more sources or another val_fraction")
        path = out / f"{split}.txt"
        path.write_bytes((DOCUMENT_SEPARATOR.join(docs) + "\n").encode("utf-8"))
        files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_of(path), "documents": len(docs)}
    manifest = {
        "format": MANIFEST_FORMAT,
        "command": command,
        "python": platform.python_version(),
        "settings": {"sources": list(sources), "val_fraction": val_fraction, "dedup_min_chars": DEDUP_MIN_CHARS,
                     "min_document_chars": MIN_DOCUMENT_CHARS, "bpe_vocab": bpe_vocab},
        "sources": records,
        "files": files,
        "bytes": sum(f["bytes"] for f in files.values()),
    }
    if bpe_vocab:
        manifest["tokenizer"] = _train_tokenizer(out, bpe_vocab, log)
    manifest["build_seconds"] = round(time.perf_counter() - start, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"{out}: train {files['train.txt']['bytes'] / 1e6:.2f} MB ({files['train.txt']['documents']} documents), "
        f"val {files['val.txt']['bytes'] / 1e6:.2f} MB ({files['val.txt']['documents']} documents), "
        f"{manifest['build_seconds']} s")
    return manifest


def tokenizer_folder(out: pathlib.Path, vocab: int) -> pathlib.Path:
    return pathlib.Path(out) / f"tokenizer-bpe{vocab}"


def _train_tokenizer(out: pathlib.Path, vocab: int, log) -> dict:
    """A byte-level BPE of ``vocab`` tokens trained on the training split, saved beside it."""
    from lightning_attention.train.tokenizer import encode_corpus, train_bpe_tokenizer

    t0 = time.perf_counter()
    train_text = (out / "train.txt").read_text(encoding="utf-8")
    tokenizer = train_bpe_tokenizer(train_text, vocab)
    folder = tokenizer_folder(out, vocab)
    tokenizer.save_pretrained(folder)
    record = {"folder": folder.name, "vocab_size": len(tokenizer),
              "sha256": sha256_of(folder / "tokenizer.json"), "seconds": round(time.perf_counter() - t0, 1)}
    for split in ("train", "val"):
        text = train_text if split == "train" else (out / "val.txt").read_text(encoding="utf-8")
        tokens = len(encode_corpus(tokenizer, text))
        record[f"{split}_tokens"] = tokens
        record[f"{split}_bytes_per_token"] = round(len(text.encode("utf-8")) / tokens, 4)
    log(f"BPE {vocab}: {record['train_tokens']:,} training tokens ({record['train_bytes_per_token']} bytes/token), "
        f"{record['val_tokens']:,} validation tokens ({record['seconds']} s)")
    return record


def load_manifest(folder: pathlib.Path) -> dict:
    """The manifest of a corpus folder, after checking that its text files are the ones it describes."""
    folder = pathlib.Path(folder)
    path = folder / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: build the corpus with "
                                f"`python -m lightning_attention.bench.corpus --out {folder}`")
    manifest = json.loads(path.read_text())
    for name, meta in manifest["files"].items():
        if (folder / name).stat().st_size != meta["bytes"] or sha256_of(folder / name) != meta["sha256"]:
            raise ValueError(f"{folder / name} is not the file its manifest describes (size or sha256 differ)")
    return manifest


def _source_list(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names or any(not re.fullmatch(r"[\w.-]+", n) for n in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated source names, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_attention.bench.corpus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(".corpus"), help="output folder")
    parser.add_argument("--sources", type=_source_list, default=DEFAULT_SOURCES,
                        help=f"comma-separated sources (default {','.join(DEFAULT_SOURCES)}; any importable package "
                             f"name gives its docstrings)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="share of documents held out (by name hash)")
    parser.add_argument("--bpe-vocab", type=int, default=8192, help="train a byte-level BPE of N tokens (0: none)")
    args = parser.parse_args(argv)
    command = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])
    build_corpus(args.out, args.sources, val_fraction=args.val_fraction, bpe_vocab=args.bpe_vocab, command=command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
