"""Named sources of English prose that every machine with the same installed packages holds offline.

A source yields documents ``(name, raw_text)`` in a fixed order (sorted paths, file order), so the same package
versions give the same bytes on every machine:

- ``python-docs``: Python's documentation topics (``pydoc_data.topics``: the language reference, one document per
  topic);
- ``python-stdlib``: the docstrings of the standard library (one document per module file; tests excluded);
- ``botocore-api``: the AWS API reference shipped with ``botocore`` (HTML; one document per service: the service,
  operation and structure descriptions of its newest API version);
- any other importable name (``numpy``, ``torch``, ``transformers``, ``json``, ...): the docstrings of that package
  (one document per module file, in source order: module, classes, functions; tests excluded).

:func:`source_version` says which version a source was read from (the manifest records it).
"""

import ast
import gzip
import importlib.metadata
import importlib.util
import json
import pathlib
import platform
import sysconfig
from collections.abc import Iterator

from lightning_attention.bench.corpus_prose import docstring_prose, html_prose

PYTHON_DOCS = "python-docs"
PYTHON_STDLIB = "python-stdlib"
BOTOCORE_API = "botocore-api"
# folders whose files are tests or copies of other projects, not the package's own documentation
_SKIPPED_DIRS = {"test", "tests", "testing", "_vendor", "vendor", "vendored", "_vendored", "site-packages",
                 "dist-packages", "__pycache__", "idlelib", "lib2to3", "turtledemo"}


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module, its classes and functions, in source order (depth first)."""
    if isinstance(tree, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _docstrings(child)


def _module_files(root: pathlib.Path) -> list[pathlib.Path]:
    if root.is_file():
        return [root]
    return sorted((p for p in root.rglob("*.py") if not _SKIPPED_DIRS & set(p.relative_to(root).parts[:-1])),
                  key=lambda p: p.relative_to(root).as_posix())


def _docstring_documents(root: pathlib.Path, prefix: str) -> Iterator[tuple[str, str]]:
    base = root.parent if root.is_file() else root
    for path in _module_files(root):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # a file for another Python version: no docstrings from it
            continue
        text = "\n\n".join(docstring_prose(d) for d in _docstrings(tree))
        if text.strip():
            yield f"{prefix}/{path.relative_to(base).as_posix()}", text


def _package_root(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"corpus source {name!r}: no such importable package here")
    origin = pathlib.Path(spec.origin)
    return origin.parent if spec.submodule_search_locations else origin


def _python_docs() -> Iterator[tuple[str, str]]:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    for name in sorted(topics):
        yield f"{PYTHON_DOCS}/{name}", docstring_prose(topics[name])


def _python_stdlib() -> Iterator[tuple[str, str]]:
    yield from _docstring_documents(pathlib.Path(sysconfig.get_paths()["stdlib"]), PYTHON_STDLIB)


def _botocore_api() -> Iterator[tuple[str, str]]:
    data = _package_root("botocore") / "data"
    for service in sorted(p for p in data.iterdir() if p.is_dir()):
        versions = sorted(v for v in service.iterdir() if (v / "service-2.json.gz").is_file()
                          or (v / "service-2.json").is_file())
        if not versions:
            continue
        newest = versions[-1]
        path = newest / "service-2.json.gz"
        raw = gzip.decompress(path.read_bytes()) if path.is_file() else (newest / "service-2.json").read_bytes()
        model = json.loads(raw)
        parts = [model.get("documentation", "")]
        for name, operation in model.get("operations", {}).items():
            if operation.get("documentation"):
                parts.append(f"<p>{name}</p>{operation['documentation']}")
        parts += [shape.get("documentation", "") for shape in model.get("shapes", {}).values()]
        text = "\n\n".join(html_prose(p) for p in parts if p)
        if text.strip():
            yield f"{BOTOCORE_API}/{service.name}", text


def documents(source: str) -> Iterator[tuple[str, str]]:
    """``(document name, text)`` of a named source, in a fixed order; the text is prose-cleaned but not filtered."""
    if source == PYTHON_DOCS:
        return _python_docs()
    if source == PYTHON_STDLIB:
        return _python_stdlib()
    if source == BOTOCORE_API:
        return _botocore_api()
    return _docstring_documents(_package_root(source), source)


def source_version(source: str) -> str:
    """The version a source is read from: Python's for the two Python sources, else the package distribution's."""
    if source in (PYTHON_DOCS, PYTHON_STDLIB):
        return f"Python {platform.python_version()}"
    top = "botocore" if source == BOTOCORE_API else source.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, [top]):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{top} (standard library, Python {platform.python_version()})"
