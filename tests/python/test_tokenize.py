"""stoker.tokenize and `stoker tokenize`: JSON Lines, text files and a packed
dataset's captions through a Hugging Face tokenizer.json into a Megatron
dataset, each document's tokens (and its end-of-document token) as the
tokenizer encodes them, in order; bad input named by file and line."""
import json
import os
import sys

import numpy as np
import pytest

import stoker

tokenizers = pytest.importorskip("tokenizers")

WORDS = "the a cat dog sat on mat ran far away quickly slowly under over bright dark river stone tree".split()


def texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(0, 30)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts(500, 1), trainers.BpeTrainer(vocab_size=120,
                                                                special_tokens=["<unk>", "<|endoftext|>"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def read_documents(prefix, count):
    loader = stoker.TokenLoader(prefix, seq_len=64, batch_size=4, shuffle=False, with_indices=True)
    docs = {}
    for batch in loader:
        for row, ids in zip(batch["documents"], batch["input_ids"].tolist()):
            at = 0
            for _, doc, offset, length in row:
                docs.setdefault(doc, []).extend(ids[at:at + length])
                at += length
    return [docs.get(d, []) for d in range(count)]


def test_jsonl_and_text_files_tokenize_in_order(tmp_path, tokenizer_file):
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    first, second = texts(70, 2), texts(30, 3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(first)))
    (tmp_path / "b.txt").write_text("\n".join(t for t in second if t.strip()) + "\n")
    result = stoker.tokenize([tmp_path / "a.jsonl", tmp_path / "b.txt"], tmp_path / "out", tokenizer_file, lines=True)
    expected = [tok.encode(t, add_special_tokens=False).ids + [eos] for t in first + [t for t in second if t.strip()]]
    assert result["documents"] == len(expected) and result["token_type"] == "uint16"
    assert result["tokens"] == sum(map(len, expected))
    assert read_documents(tmp_path / "out", len(expected)) == expected
    again = stoker.tokenize([tmp_path / "a.jsonl", tmp_path / "b.txt"], tmp_path / "again", tokenizer_file,
                            lines=True, batch_size=7)
    assert again["tokens"] == result["tokens"]
    for ext in (".idx", ".bin"):  # deterministic, whatever the batch size
        assert (tmp_path / ("again" + ext)).read_bytes() == (tmp_path / ("out" + ext)).read_bytes()


def test_a_packed_datasets_captions_tokenize(cli, tmp_path, tokenizer_file):
    from PIL import Image
    captions = texts(12, 4)
    rows = []
    for i, caption in enumerate(captions):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / ("%d.png" % i))
        rows.append({"path": "%d.png" % i, "txt": caption})
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli("pack", tmp_path / "m.jsonl", tmp_path / "packed")
    r = stoker.tokenize(tmp_path / "packed", tmp_path / "caps", tokenizer_file, eos=None)
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    assert read_documents(tmp_path / "caps", len(captions)) == [tok.encode(c, add_special_tokens=False).ids
                                                                 for c in captions]
    assert r["documents"] == len(captions)


def test_bad_input_is_named_and_the_cli_says_it(cli, tmp_path, tokenizer_file):
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: 'text' is int, not text"):
        stoker.tokenize(tmp_path / "bad.jsonl", tmp_path / "x", tokenizer_file)
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n\n{oops\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:3: not valid JSON"):
        stoker.tokenize(tmp_path / "broken.jsonl", tmp_path / "x", tokenizer_file)
    assert not (tmp_path / "x.idx").exists()  # nothing that opens was left
    with pytest.raises(ValueError, match="eos=\"auto\""):
        stoker.tokenize(tmp_path / "bad.jsonl", tmp_path / "x", tokenizers.Tokenizer(tokenizers.models.BPE()))
    (tmp_path / "ok.jsonl").write_text('{"body": "the cat sat"}\n')
    env = dict(os.environ, STOKER_PYTHON=sys.executable)  # the Python that has tokenizers
    r = cli("tokenize", tmp_path / "ok.jsonl", "-o", tmp_path / "cli", "--tokenizer", tokenizer_file,
            "--text-field", "body", env=env)
    assert "tokenized 1 document into" in r.stdout
    assert stoker.TokenLoader(tmp_path / "cli", seq_len=4).num_documents == 1
    r = cli("tokenize", tmp_path / "bad.jsonl", "-o", tmp_path / "y", "--tokenizer", tokenizer_file, check=False,
            env=env)
    assert r.returncode == 1 and "bad.jsonl:2" in r.stderr
    # A tokenizer that is not there is named as such, whatever the Python has installed.
    for missing in ("missing.json", "missing.model"):
        r = cli("tokenize", tmp_path / "ok.jsonl", "-o", tmp_path / "z", "--tokenizer", tmp_path / missing,
                check=False)
        assert r.returncode == 1 and "%s: no such" % (tmp_path / missing) in r.stderr, r.stderr


def test_compressed_and_parquet_corpora_tokenize_as_the_plain_jsonl(cli, tmp_path, tokenizer_file):
    # Corpora ship as .jsonl.zst (The Pile), .json.gz and Parquet shards (Hugging Face): each was "cannot tell
    # what it is" before. Each gives the same dataset, byte for byte, as the plain JSON Lines file.
    import bz2
    import gzip
    import lzma

    import pyarrow
    import pyarrow.parquet
    import zstandard
    corpus = texts(300, 6)
    plain = "".join(json.dumps({"text": t}) + "\n" for t in corpus).encode()
    (tmp_path / "plain.jsonl").write_bytes(plain)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(plain))
    (tmp_path / "c.json.bz2").write_bytes(bz2.compress(plain))
    (tmp_path / "c.jsonl.xz").write_bytes(lzma.compress(plain))
    half = plain.index(b"\n", len(plain) // 2) + 1  # two frames, as zstd -T and pzstd write
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(plain[:half]) +
                                           zstandard.ZstdCompressor().compress(plain[half:]))
    table = pyarrow.table({"id": list(range(len(corpus))), "text": corpus})
    pyarrow.parquet.write_table(table, tmp_path / "c.parquet", row_group_size=64)  # several row groups
    stoker.tokenize(tmp_path / "plain.jsonl", tmp_path / "plain", tokenizer_file)
    for name in ("c.jsonl.gz", "c.json.bz2", "c.jsonl.xz", "c.jsonl.zst", "c.parquet"):
        prefix = tmp_path / ("out-" + name.replace(".", "-"))
        r = stoker.tokenize(tmp_path / name, prefix, tokenizer_file)
        assert r["documents"] == len(corpus), name
        for ext in (".idx", ".bin"):
            assert (tmp_path / ("plain" + ext)).read_bytes() == (tmp_path / (prefix.name + ext)).read_bytes(), name
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress("\n".join(corpus).encode()))
    assert stoker.tokenize(tmp_path / "t.txt.gz", tmp_path / "lines", tokenizer_file, lines=True)["documents"] == \
        sum(1 for t in corpus if t.strip())

    # What cannot be read is named, with where it stopped.
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(plain)[:-40])
    with pytest.raises(ValueError, match=r"cut.jsonl.gz: cannot be read past line \d+ \(EOFError"):
        stoker.tokenize(tmp_path / "cut.jsonl.gz", tmp_path / "x", tokenizer_file)
    # zstandard's own stream reader ends quietly inside a cut frame: the lines there were lost without a word.
    (tmp_path / "cut.jsonl.zst").write_bytes((tmp_path / "c.jsonl.zst").read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"cut.jsonl.zst: cannot be read past line \d+ .*ends inside a frame"):
        stoker.tokenize(tmp_path / "cut.jsonl.zst", tmp_path / "x", tokenizer_file)
    pyarrow.parquet.write_table(pyarrow.table({"text": ["a cat", None]}), tmp_path / "null.parquet")
    with pytest.raises(ValueError, match=r"null.parquet: row 1 \(counting from 0\): 'text' is null"):
        stoker.tokenize(tmp_path / "null.parquet", tmp_path / "x", tokenizer_file)
    with pytest.raises(ValueError, match=r"c.parquet: no 'body' column \(its columns: id, text; give text_field=\)"):
        stoker.tokenize(tmp_path / "c.parquet", tmp_path / "x", tokenizer_file, text_field="body")
    with pytest.raises(ValueError, match=r"c.parquet: column 'id' is int64, not text"):
        stoker.tokenize(tmp_path / "c.parquet", tmp_path / "x", tokenizer_file, text_field="id")
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"fake.parquet: not a Parquet file"):
        stoker.tokenize(tmp_path / "fake.parquet", tmp_path / "x", tokenizer_file)
    assert not (tmp_path / "x.idx").exists()
    env = dict(os.environ, STOKER_PYTHON=sys.executable)
    r = cli("tokenize", tmp_path / "c.jsonl.zst", tmp_path / "c.parquet", "-o", tmp_path / "both", "--tokenizer",
            tokenizer_file, env=env)
    assert "tokenized %d documents" % (2 * len(corpus)) in r.stdout


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("spm")
    (folder / "corpus.txt").write_text("\n".join(texts(800, 5)) + "\n")
    spm.SentencePieceTrainer.train(input=str(folder / "corpus.txt"), model_prefix=str(folder / "m"), vocab_size=40,
                                   minloglevel=2, num_threads=1)
    return folder / "m.model"


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_sentencepiece_model_tokenizes_as_sentencepiece_encodes(cli, tmp_path, sentencepiece_model, backend):
    spm = pytest.importorskip("sentencepiece")
    reference = spm.SentencePieceProcessor(model_file=str(sentencepiece_model))  # PyPI's build, not ours
    docs = texts(300, 6) + ["", "stones \u00e9t\u00e9 \u4e2d"]  # empty, and characters the model never saw
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    result = stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "sp", sentencepiece_model, batch_size=64, backend=backend)
    assert result["backend"].startswith("libsentencepiece" if backend == "native" else "sentencepiece")
    expected = [ids + [reference.eos_id()] for ids in reference.encode(docs)]  # eos="auto": the model's </s>
    assert result["documents"] == len(docs) and result["token_type"] == "uint16"
    assert result["tokens"] == sum(map(len, expected))
    assert read_documents(tmp_path / "sp", len(docs)) == expected
    none = stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "sp-no-eos", sentencepiece_model, eos=None, batch_size=1000,
                           backend=backend)
    assert read_documents(tmp_path / "sp-no-eos", len(docs)) == reference.encode(docs)
    assert none["tokens"] == result["tokens"] - len(docs)
    with pytest.raises(ValueError, match="is not a token"):
        stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "x", sentencepiece_model, eos="<|endoftext|>", backend=backend)
    (tmp_path / "junk.model").write_bytes(b"\xff\xfe not a model")
    with pytest.raises(ValueError, match="junk.model: not a SentencePiece model"):
        stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "x", tmp_path / "junk.model", backend=backend)
    with pytest.raises(FileNotFoundError, match="nope.model"):
        stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "x", tmp_path / "nope.model", backend=backend)
    with pytest.raises(ValueError, match="junk.json: not a Hugging Face tokenizer.json"):
        (tmp_path / "junk.json").write_bytes(b"\xff{")
        stoker.tokenize(tmp_path / "a.jsonl", tmp_path / "x", tmp_path / "junk.json")
    assert not (tmp_path / "x.idx").exists()
    r = cli("tokenize", tmp_path / "a.jsonl", "-o", tmp_path / "cli", "--tokenizer", sentencepiece_model,
            "--backend", backend, env=dict(os.environ, STOKER_PYTHON=sys.executable))
    assert "tokenized %d documents" % len(docs) in r.stdout
    for ext in (".idx", ".bin"):
        assert (tmp_path / ("cli" + ext)).read_bytes() == (tmp_path / ("sp" + ext)).read_bytes()
