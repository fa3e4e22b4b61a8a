"""stoker.tokenize: text to a Megatron indexed dataset (PREFIX.idx +
PREFIX.bin) for stoker.TokenLoader, Megatron-core, NeMo or GPT-NeoX.

    stoker.tokenize(["part-0.jsonl", "part-1.jsonl"], "corpus_text_document", tokenizer="tokenizer.json")
    stoker tokenize part-*.jsonl -o corpus_text_document --tokenizer tokenizer.json

Documents come from JSON Lines files (one object per line, the text under
``text_field``), text files (one document per file, or per line with
``lines=True``), both also compressed (.gz, .bz2, .xz, .zst), Parquet files
(the ``text_field`` column; PyPI's pyarrow) or a packed stoker dataset (its
``.txt`` field, or ``text_field``), in the order given. A Hugging Face ``tokenizer.json`` (PyPI
``tokenizers``) or a SentencePiece ``.model`` (PyPI's sentencepiece when
it imports, else stoker's C++ over Debian's libsentencepiece; see
``backend``) encodes them in batches on all cores, without special tokens; an end-of-document token is appended (``eos="auto"``: a
SentencePiece model's own EOS, else the tokenizer's ``<|endoftext|>``,
``</s>``, ``<eos>`` or ``<|end_of_text|>``; a token; an id; or None). The output is
deterministic and written as stoker.write_tokens writes it: the index last,
so an interrupted run leaves nothing that opens.
"""
import os
import sys
import time

from . import _native, _params, _text_sources
from ._text import counted

__all__ = ["tokenize"]

_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>")


class _HuggingFace:
    """A Hugging Face tokenizer (tokenizers.Tokenizer): encode_batch on all cores."""

    def __init__(self, tokenizer):
        if not hasattr(tokenizer, "encode_batch"):
            path = os.fspath(tokenizer)
            if not os.path.exists(path):
                raise FileNotFoundError("%s: no such tokenizer file" % path)
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ImportError("stoker.tokenize needs Hugging Face's tokenizers for %s, which %s cannot import: pip "
                                  "install tokenizers, or set STOKER_PYTHON to a Python that has it (the command line "
                                  "runs it)" % (path, sys.executable)) from None
            try:
                tokenizer = Tokenizer.from_file(path)
            except Exception as e:  # tokenizers raises a bare Exception
                raise ValueError("%s: not a Hugging Face tokenizer.json (%s); a SentencePiece model must end in .model"
                                 % (path, e)) from None
        self.tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.backend = "tokenizers"

    def piece_id(self, piece):
        return self.tok.token_to_id(piece)

    def default_eos(self):
        return None

    def encode_into(self, writer, texts, eos_id):
        return writer.add_documents([e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)], eos_id)


class _SentencePiece:
    """A SentencePiece .model on all cores, off the GIL: by PyPI's sentencepiece when it imports (the ids
    Megatron-LM's preprocess_data.py writes; its 0.2 encodes twice as fast as Debian 12's 0.1.97), else by
    stoker's C++ over Debian's libsentencepiece (no PyPI package needed)."""

    def __init__(self, path, backend):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError("%s: no such SentencePiece model" % path)
        self.python = None
        if backend in ("auto", "python"):
            try:
                import sentencepiece
            except ImportError:
                if backend == "python":
                    raise ImportError("backend=\"python\" needs PyPI's sentencepiece, which %s cannot import: pip "
                                      "install sentencepiece, or set STOKER_PYTHON to a Python that has it (the "
                                      "command line runs it)" % sys.executable) from None
            else:
                try:
                    self.python = sentencepiece.SentencePieceProcessor(model_file=path)
                except (RuntimeError, OSError):
                    raise ValueError("%s: not a SentencePiece model (it does not parse as one)" % path) from None
                self.vocab_size = self.python.get_piece_size()
                self.backend = "sentencepiece %s (Python)" % sentencepiece.__version__
        if self.python is None:
            self.native = _native.SentencePieceEncoder(path)
            self.vocab_size = self.native.vocab_size
            self.backend = "libsentencepiece (stoker's C++)"

    def piece_id(self, piece):
        if self.python is None:
            return self.native.piece_id(piece)
        i = self.python.piece_to_id(piece)
        return i if self.python.id_to_piece(i) == piece else None  # unknown pieces map to <unk>

    def default_eos(self):
        if self.python is None:
            return self.native.eos_id
        i = self.python.eos_id()
        return i if i >= 0 else None

    def encode_into(self, writer, texts, eos_id):
        if self.python is None:
            return self.native.encode_into(writer, texts, eos_id)
        return writer.add_documents(self.python.encode(texts, num_threads=os.cpu_count() or 1), eos_id)


def _tokenizer(tokenizer, backend):
    if backend not in ("auto", "native", "python"):
        raise ValueError("backend=%r: expected \"auto\", \"native\" or \"python\"" % (backend,))
    if isinstance(tokenizer, (str, os.PathLike)) and os.fspath(tokenizer).endswith(".model"):
        return _SentencePiece(tokenizer, backend)
    if backend != "auto":
        raise ValueError("backend=%r is for SentencePiece models (.model)" % (backend,))
    return _HuggingFace(tokenizer)


def _eos_id(tokenizer, eos):
    if eos is None:
        return None
    if eos == "auto":
        i = tokenizer.default_eos()
        if i is not None:
            return i
        for name in _EOS_NAMES:
            i = tokenizer.piece_id(name)
            if i is not None:
                return i
        raise ValueError("eos=\"auto\": the tokenizer has none of %s; give eos=<id> or eos=None" % ", ".join(_EOS_NAMES))
    if isinstance(eos, str):
        i = tokenizer.piece_id(eos)
        if i is None:
            raise ValueError("eos=%r is not a token of the tokenizer" % (eos,))
        return i
    return _params.integer("eos", eos, 0, (1 << 31) - 1)


def tokenize(inputs, prefix, tokenizer, text_field="text", lines=False, eos="auto", token_type=None,
             overwrite=False, batch_size=1024, progress=None, backend="auto"):
    """Tokenizes ``inputs`` into the Megatron dataset ``prefix``; returns
    {"documents", "tokens", "seconds", "token_type", "prefix", "backend"}.
    ``backend`` (SentencePiece models): "python" (PyPI's sentencepiece),
    "native" (stoker's C++ over libsentencepiece) or "auto" (the first that
    is there).
    ``token_type``: default uint16 for vocabularies under 65,500 tokens,
    else int32 (Megatron's rule). ``progress``: a line on stderr every
    second (default: when stderr is a terminal)."""
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    tok = _tokenizer(tokenizer, backend)
    eos_id = _eos_id(tok, eos)
    vocab = tok.vocab_size
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
        tokens += tok.encode_into(writer, batch, eos_id)
        documents += len(batch)
        batch.clear()

    for text in _text_sources.documents(inputs, text_field, lines):
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
            "prefix": os.fspath(prefix), "backend": tok.backend}


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="stoker tokenize", description="Text to a Megatron indexed dataset "
                                 "(PREFIX.idx + PREFIX.bin) with a Hugging Face tokenizer.json or a SentencePiece .model")
    ap.add_argument("inputs", nargs="+", help=".jsonl or .txt files (each may be .gz, .bz2, .xz or .zst), .parquet "
                    "files or packed stoker datasets, in order")
    ap.add_argument("-o", "--output", required=True, help="the dataset's prefix (PREFIX.idx and PREFIX.bin)")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json or a SentencePiece .model")
    ap.add_argument("--text-field", default="text", help="the JSON Lines member or Parquet column holding the text "
                    "(default: text)")
    ap.add_argument("--lines", action="store_true", help=".txt files: one document per line")
    ap.add_argument("--eos", default="auto", help="auto, none, a token or an id (default: auto)")
    ap.add_argument("--token-type", choices=("uint8", "int8", "int16", "uint16", "int32", "int64"))
    ap.add_argument("--force", action="store_true", help="replace PREFIX.idx/.bin")
    ap.add_argument("--backend", choices=("auto", "native", "python"), default="auto",
                    help="SentencePiece models: PyPI's sentencepiece (python) or stoker's C++ (native); "
                    "auto: python when it imports")
    args = ap.parse_args(argv)
    eos = None if args.eos == "none" else int(args.eos) if args.eos.isdigit() else args.eos
    try:
        r = tokenize(args.inputs, args.output, args.tokenizer, text_field=args.text_field, lines=args.lines, eos=eos,
                     token_type=args.token_type, overwrite=args.force, backend=args.backend)
    except (ValueError, OSError, ImportError, RuntimeError) as e:  # RuntimeError: stoker.StokerError
        sys.stderr.write("stoker tokenize: %s\n" % e)
        return 1
    print("tokenized %s into %s (%s, %s) in %.1f s: %s.idx, %s.bin" % (
        counted(r["documents"], "document", "documents"), counted(r["tokens"], "token", "tokens"), r["token_type"],
        r["backend"], r["seconds"], r["prefix"], r["prefix"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
