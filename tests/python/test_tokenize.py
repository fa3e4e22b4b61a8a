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
    assert "tokenized 1 documents" in r.stdout
    assert stoker.TokenLoader(tmp_path / "cli", seq_len=4).num_documents == 1
    r = cli("tokenize", tmp_path / "bad.jsonl", "-o", tmp_path / "y", "--tokenizer", tokenizer_file, check=False,
            env=env)
    assert r.returncode == 1 and "bad.jsonl:2" in r.stderr


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
