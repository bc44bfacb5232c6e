"""The corpus script: prose out of documentation, a deterministic build, a split by whole documents, the manifest."""

import hashlib
import json

import pytest

from lightning_attention.bench import corpus
from lightning_attention.bench.corpus_prose import docstring_prose, html_prose, prose_paragraphs

DOCSTRING = '''Sum the elements of an array along an axis.

Parameters
----------
a : array_like
    The input array, of any shape.

Examples
--------
>>> total([1, 2, 3])
6
>>> total([])
0

The reduction runs in the input's precision; see :func:`~numpy.sum` and
:ref:`the user guide <reductions>` for the details::

    x = total(values)
    y = x * 2

.. code-block:: python

    print(total([4]))

.. note:: Empty inputs give zero.
   This mirrors Python's own behaviour.

```python
total([1])
```

The loop over blocks is written in plain language here.'''


def test_docstring_prose_keeps_the_sentences_and_drops_the_code():
    prose = docstring_prose(DOCSTRING)
    for kept in ("Sum the elements of an array along an axis.", "a : array_like", "The input array, of any shape.",
                 "see numpy.sum and", "the user guide for the details:", "Note: Empty inputs give zero.",
                 "This mirrors Python's own behaviour.", "The loop over blocks is written in plain language here."):
        assert kept in prose, kept
    for dropped in (">>>", "total([1, 2, 3])", "x = total(values)", "print(", "```", "----------", ":func:", "::",
                    ".. note"):
        assert dropped not in prose, dropped


def test_indented_code_after_a_colon_goes_and_indented_prose_stays():
    text = "A loop looks like this:\n\n   for i in range(10):\n       print(i)\n\nThe grammar:\n\n   " \
           "for_stmt ::= \"for\" target_list\n\nA list follows:\n\n   the first item of it\n   the second one\n"
    prose = docstring_prose(text)
    assert "print(i)" not in prose and "for_stmt" not in prose
    assert "the first item of it" in prose and "A loop looks like this:" in prose


def test_html_prose_paragraphs_and_lists_without_preformatted_code():
    html = ("<p>Creates a <code>Bucket</code> &amp; its <a href='x'>policy</a>.</p><ul><li>one</li><li>two</li></ul>"
            "<pre>aws s3 mb s3://x</pre><note>Takes <b>minutes</b>.</note>")
    assert html_prose(html) == "Creates a Bucket & its policy.\n\n- one\n- two\n\nTakes minutes."


def test_prose_paragraphs_drop_code_and_tables():
    text = "A sentence about arrays and their shapes.\n\nx = np.zeros((3, 4))\ny = x[:, 1:]\n\n" \
           "| 1 | 2 |\n| 3.5 | 4.5 |\n\nAnother paragraph of words."
    kept, dropped = prose_paragraphs(text)
    assert kept == ["A sentence about arrays and their shapes.", "Another paragraph of words."]
    assert dropped > 0


SHARED = "A paragraph that two modules copy word for word, long enough to be recognised as a copy of the other."


def _fake_documents(source):
    docs = [(f"{source}/doc{i}", f"Document {i} of {source} talks about topic {i} in plain English words.\n\n"
                                 f"{SHARED}\n\n" + " ".join([f"Sentence {j} of {source} document {i} follows."
                                                               for j in range(12)])) for i in range(40)]
    return iter(docs + [(f"{source}/short", "Too short to keep.")])


@pytest.fixture
def fake_sources(monkeypatch):
    monkeypatch.setattr(corpus, "documents", _fake_documents)
    monkeypatch.setattr(corpus, "source_version", lambda source: f"{source} 1.0")


def test_split_by_document_hash_deduplicated(tmp_path, fake_sources):
    manifest = corpus.build_corpus(tmp_path, ("alpha", "beta"), val_fraction=0.2, bpe_vocab=0, log=lambda *_: None)
    train = (tmp_path / "train.txt").read_text()
    val = (tmp_path / "val.txt").read_text()
    both = train + val
    assert both.count(SHARED) == 1  # kept once across sources and splits
    assert "Too short to keep." not in both
    for source in ("alpha", "beta"):
        for i in range(40):
            head = f"Document {i} of {source} talks"
            expected = val if corpus.is_validation(f"{source}/doc{i}", 0.2) else train
            assert head in expected and both.count(head) == 1
    record = {r["source"]: r for r in manifest["sources"]}
    assert record["alpha"]["version"] == "alpha 1.0" and record["alpha"]["documents_read"] == 41
    assert sum(r["documents"]["val"] for r in record.values()) == manifest["files"]["val.txt"]["documents"]
    assert 0 < manifest["files"]["val.txt"]["documents"] < 40  # about a fifth of 80 documents
    for name, meta in manifest["files"].items():
        data = (tmp_path / name).read_bytes()
        assert meta["bytes"] == len(data) and meta["sha256"] == hashlib.sha256(data).hexdigest()
    assert json.loads((tmp_path / "manifest.json").read_text())["files"] == manifest["files"]


def test_bpe_is_trained_on_the_training_split_and_checked_on_load(tmp_path, fake_sources):
    manifest = corpus.build_corpus(tmp_path, ("alpha",), val_fraction=0.2, bpe_vocab=300, log=lambda *_: None)
    tok = manifest["tokenizer"]
    folder = tmp_path / tok["folder"]
    assert tok["vocab_size"] == 300 and tok["sha256"] == corpus.sha256_of(folder / "tokenizer.json")
    assert tok["train_bytes_per_token"] > 1.0 and tok["val_tokens"] > 0
    assert corpus.load_manifest(tmp_path)["tokenizer"] == tok
    (tmp_path / "val.txt").write_text("changed")
    with pytest.raises(ValueError, match="not the file its manifest describes"):
        corpus.load_manifest(tmp_path)


def test_real_sources_build_the_same_bytes_twice(tmp_path):
    argv = ["--sources", "python-docs,json", "--bpe-vocab", "0", "--val-fraction", "0.1"]
    assert corpus.main(["--out", str(tmp_path / "a"), *argv]) == 0
    assert corpus.main(["--out", str(tmp_path / "b"), *argv]) == 0
    a, b = (json.loads((tmp_path / x / "manifest.json").read_text()) for x in ("a", "b"))
    assert a["files"] == b["files"]
    assert [s["version"] for s in a["sources"]][0].startswith("Python ")
    assert a["command"].endswith("--out " + str(tmp_path / "a") + " " + " ".join(argv))
    text = (tmp_path / "a" / "train.txt").read_text()
    assert "The “for” statement" in text or 'The "for" statement' in text
    assert ">>>" not in text
