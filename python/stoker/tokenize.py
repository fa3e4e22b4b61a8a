"""stoker.tokenize: text to a Megatron indexed dataset (PREFIX.idx +
PREFIX.bin) for stoker.TokenLoader, Megatron-core, NeMo or GPT-NeoX.

    stoker.tokenize(["part-0.jsonl", "part-1.jsonl"], "corpus_text_document", tokenizer="tokenizer.json")
    stoker tokenize part-*.jsonl -o corpus_text_document --tokenizer tokenizer.json

Documents come from JSON Lines files (one object per line, the text under
``text_field``), text files (one document per file, or per line with
``lines=True``) or a packed stoker dataset (its ``.txt`` field, or
``text_field``), in the order given. A Hugging Face ``tokenizer.json`` (PyPI
``tokenizers``) encodes them in batches on all cores; an end-of-document
token is appended (``eos="auto"``: the tokenizer's ``<|endoftext|>``,
``</s>``, ``<eos>`` or ``<|end_of_text|>``; an id; or None). The output is
deterministic and written as stoker.write_tokens writes it: the index last,
so an interrupted run leaves nothing that opens.
"""
import json
import os
import sys
import time

from . import _native, _params

__all__ = ["tokenize"]

_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>")


def _eos_id(tokenizer, eos):
    if eos is None:
        return None
    if eos == "auto":
        for name in _EOS_NAMES:
            i = tokenizer.token_to_id(name)
            if i is not None:
                return i
        raise ValueError("eos=\"auto\": the tokenizer has none of %s; give eos=<id> or eos=None" % ", ".join(_EOS_NAMES))
    if isinstance(eos, str):
        i = tokenizer.token_to_id(eos)
        if i is None:
            raise ValueError("eos=%r is not a token of the tokenizer" % (eos,))
        return i
    return _params.integer("eos", eos, 0, (1 << 31) - 1)


def _jsonl(path, text_field):
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError("%s:%d: not valid JSON (%s)" % (path, number, e)) from None
            if not isinstance(obj, dict) or text_field not in obj:
                raise ValueError("%s:%d: no %r field (give text_field=)" % (path, number, text_field))
            text = obj[text_field]
            if not isinstance(text, str):
                raise ValueError("%s:%d: %r is %s, not text" % (path, number, text_field, type(text).__name__))
            yield text


def _text_file(path, lines):
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("%s: not UTF-8 at byte %d" % (path, e.start)) from None
    if not lines:
        yield text
        return
    for line in text.splitlines():
        if line.strip():
            yield line


def _stoker_dataset(location, text_field):
    from . import Loader, Text
    key = text_field if text_field != "text" else "txt"
    loader = Loader(location, batch_size=256, shuffle=False, fields={"text": Text(key)}, log_epochs=False)
    for batch in loader:
        yield from batch["text"]


def _documents(inputs, text_field, lines):
    for source in inputs:
        source = os.fspath(source)
        if source.endswith(".jsonl") or source.endswith(".json"):
            yield from _jsonl(source, text_field)
        elif source.endswith(".txt"):
            yield from _text_file(source, lines)
        elif os.path.isdir(source) or "://" in source or source.endswith(".stoker"):
            yield from _stoker_dataset(source, text_field)
        else:
            raise ValueError("%s: cannot tell what it is (expected .jsonl, .txt or a packed stoker dataset)" % source)


def tokenize(inputs, prefix, tokenizer, text_field="text", lines=False, eos="auto", token_type=None,
             overwrite=False, batch_size=1024, progress=None):
    """Tokenizes ``inputs`` into the Megatron dataset ``prefix``; returns
    {"documents", "tokens", "seconds", "token_type", "prefix"}.
    ``token_type``: default uint16 for vocabularies under 65,500 tokens,
    else int32 (Megatron's rule). ``progress``: a line on stderr every
    second (default: when stderr is a terminal)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("stoker.tokenize needs Hugging Face's tokenizers, which %s cannot import (pip install "
                          "tokenizers; the command line runs $STOKER_PYTHON)" % sys.executable) from None
    import numpy as np
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    tok = tokenizer if hasattr(tokenizer, "encode_batch") else Tokenizer.from_file(os.fspath(tokenizer))
    eos_id = _eos_id(tok, eos)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if token_type is None:
        token_type = "uint16" if vocab < 65500 else "int32"
    batch_size = _params.integer("batch_size", batch_size, 1, 1 << 20)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    writer = _native.TokenDatasetWriter(os.fspath(prefix), token_type, _params.boolean("overwrite", overwrite))
    start = last = time.monotonic()
    documents = tokens = 0
    batch = []

    def flush():
        nonlocal documents, tokens
        for encoding in tok.encode_batch(batch, add_special_tokens=False):
            ids = encoding.ids
            if eos_id is not None:
                ids.append(eos_id)
            writer.add_document(np.asarray(ids, dtype=np.int64))
            tokens += len(ids)
        documents += len(batch)
        batch.clear()

    for text in _documents(inputs, text_field, lines):
        batch.append(text)
        if len(batch) == batch_size:
            flush()
            now = time.monotonic()
            if show and now - last >= 1:
                last = now
                sys.stderr.write("\rtokenize: %d documents, %d tokens, %.0f documents/s" %
                                 (documents, tokens, documents / (now - start)))
                sys.stderr.flush()
    if batch:
        flush()
    writer.finish()
    seconds = time.monotonic() - start
    if show:
        sys.stderr.write("\rtokenize: %d documents, %d tokens in %.1f s\n" % (documents, tokens, seconds))
    return {"documents": documents, "tokens": tokens, "seconds": seconds, "token_type": token_type,
            "prefix": os.fspath(prefix)}


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="stoker tokenize", description="Text to a Megatron indexed dataset "
                                 "(PREFIX.idx + PREFIX.bin) with a Hugging Face tokenizer.json")
    ap.add_argument("inputs", nargs="+", help=".jsonl files, .txt files or packed stoker datasets, in order")
    ap.add_argument("-o", "--output", required=True, help="the dataset's prefix (PREFIX.idx and PREFIX.bin)")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("--text-field", default="text", help="the JSON Lines member holding the text (default: text)")
    ap.add_argument("--lines", action="store_true", help=".txt files: one document per line")
    ap.add_argument("--eos", default="auto", help="auto, none, a token or an id (default: auto)")
    ap.add_argument("--token-type", choices=("uint8", "int8", "int16", "uint16", "int32", "int64"))
    ap.add_argument("--force", action="store_true", help="replace PREFIX.idx/.bin")
    args = ap.parse_args(argv)
    eos = None if args.eos == "none" else int(args.eos) if args.eos.isdigit() else args.eos
    try:
        r = tokenize(args.inputs, args.output, args.tokenizer, text_field=args.text_field, lines=args.lines, eos=eos,
                     token_type=args.token_type, overwrite=args.force)
    except (ValueError, OSError, ImportError) as e:
        sys.stderr.write("stoker tokenize: %s\n" % e)
        return 1
    print("tokenized %d documents into %d tokens (%s) in %.1f s: %s.idx, %s.bin" % (
        r["documents"], r["tokens"], r["token_type"], r["seconds"], r["prefix"], r["prefix"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
