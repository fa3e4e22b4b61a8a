"""stoker.TokenLoader and stoker.write_tokens: Megatron indexed datasets
written byte for byte as Megatron-core's builder writes them (the layout
spelled out here with NumPy), read back as packed rows with labels,
positions and segment boundaries, every token once over any world size,
resumed under another world size, and bad files named."""
import struct

import numpy as np
import pytest
import torch

import stoker

rng = np.random.default_rng(5)
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8}


def megatron_files(prefix, documents, dtype=np.uint16):
    """PREFIX.idx/.bin as Megatron-core's IndexedDatasetBuilder writes them (add_document per document)."""
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]]).astype(
        np.int64) if len(documents) else np.zeros(0, np.int64)
    boundaries = np.arange(len(documents) + 1, dtype=np.int64)
    with open(str(prefix) + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(documents)) + struct.pack("<Q", len(documents) + 1))
        f.write(lengths.tobytes() + pointers.tobytes() + boundaries.tobytes())


def documents(n=50, vocab=50000):
    return [rng.integers(0, vocab, int(rng.integers(0, 60))) for _ in range(n)]


def test_write_tokens_is_byte_identical_to_megatrons_layout(tmp_path):
    docs = documents()
    megatron_files(tmp_path / "ref", docs)
    assert stoker.write_tokens(tmp_path / "ours", docs, "uint16") == len(docs)
    for ext in (".idx", ".bin"):
        assert (tmp_path / ("ours" + ext)).read_bytes() == (tmp_path / ("ref" + ext)).read_bytes()
    with pytest.raises(FileExistsError):
        stoker.write_tokens(tmp_path / "ours", docs)
    stoker.write_tokens(tmp_path / "ours", docs[:3], overwrite=True)
    with pytest.raises(ValueError, match="does not fit in uint8"):
        stoker.write_tokens(tmp_path / "small", [[1, 2, 300]], "uint8")
    with pytest.raises(ValueError, match="token_type must be one of"):
        stoker.write_tokens(tmp_path / "x", [[1]], "bf16")


def test_batches_hold_the_packed_stream(tmp_path):
    docs = [np.array([1, 2, 3]), np.array([], dtype=np.int64), np.array([4, 5, 6, 7]), np.array([8, 9])]
    megatron_files(tmp_path / "c", docs, np.int32)
    loader = stoker.TokenLoader(tmp_path / "c", seq_len=4, batch_size=2, shuffle=False, with_indices=True)
    assert (loader.num_tokens, loader.num_documents, loader.num_rows, len(loader)) == (9, 4, 3, 2)
    first, last = list(loader)
    assert first["input_ids"].dtype == torch.int64 and first["input_ids"].shape == (2, 4)
    assert first["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert first["labels"].tolist() == [[2, 3, 4, 5], [6, 7, 8, 9]]
    assert first["position_ids"].tolist() == [[0, 1, 2, 0], [1, 2, 3, 0]]
    assert first["cu_seqlens"].dtype == torch.int32 and first["cu_seqlens"].tolist() == [0, 3, 4, 7, 8]
    assert first["documents"] == [[(0, 0, 0, 3), (0, 2, 0, 1)], [(0, 2, 1, 3), (0, 3, 0, 1)]]
    assert last["input_ids"].tolist() == [[9, 0, 0, 0]] and last["labels"].tolist() == [[-100] * 4]
    assert loader.epoch == 1


def test_without_labels_across_documents_no_document_predicts_the_next(tmp_path):
    docs = documents(200)
    megatron_files(tmp_path / "c", docs)
    across = stoker.TokenLoader(tmp_path / "c", seq_len=64, batch_size=4, seed=1)
    within = stoker.TokenLoader(tmp_path / "c", seq_len=64, batch_size=4, seed=1, labels_across_documents=False,
                                ignore_index=-1, with_indices=True)
    masked = 0
    for a, w in zip(across, within, strict=True):
        assert torch.equal(a["input_ids"], w["input_ids"]) and torch.equal(a["position_ids"], w["position_ids"])
        # Inside a row: ignored exactly where the next position starts a document.
        inner = w["position_ids"][:, 1:] != 0
        assert torch.equal(w["labels"][:, :-1][inner], a["labels"][:, :-1][inner])
        assert (w["labels"][:, :-1][~inner] == -1).all()
        masked += int((~inner).sum())
        # A row's last label: ignored exactly where the row's last piece ends its document.
        for row, pieces in enumerate(w["documents"]):
            _, doc, offset, length = pieces[-1]
            ends = offset + length == len(docs[doc])
            assert w["labels"][row, -1].item() == (-1 if ends else a["labels"][row, -1].item())
    assert masked > 100
    with pytest.raises(TypeError, match="labels_across_documents"):
        stoker.TokenLoader(tmp_path / "c", seq_len=64, labels_across_documents="no")


def test_the_sampler_counts_this_rank_s_rows_and_sets_the_epoch(tmp_path):
    megatron_files(tmp_path / "c", documents(120))
    for global_batch, world in [(8, 3), (5, 2), (7, 7), (4, 1)]:
        counted = []
        for rank in range(world):
            loader = stoker.TokenLoader(tmp_path / "c", seq_len=16, global_batch_size=global_batch, rank=rank,
                                        world_size=world, log_epochs=False)
            loader.sampler.set_epoch(3)
            assert loader.sampler.epoch == 3 == loader.epoch
            rows = sum(batch["input_ids"].shape[0] for batch in loader)
            assert len(loader.sampler) == rows, (global_batch, world, rank)
            counted.append(rows)
        assert sum(counted) == loader.num_rows
    with pytest.raises(TypeError, match="TokenLoader's sampler has no indices"):
        iter(loader.sampler)


def test_kernel_readahead_is_said_and_changes_no_token(tmp_path):
    megatron_files(tmp_path / "c", documents())
    auto = stoker.TokenLoader(tmp_path / "c", seq_len=16, batch_size=4, seed=3)
    assert "fit the page cache" in auto.readahead_note, auto.readahead_note  # a tiny corpus
    off = stoker.TokenLoader(tmp_path / "c", seq_len=16, batch_size=4, seed=3, kernel_readahead="off")
    assert off.readahead_note == "kernel read-ahead off for the token files (kernel_readahead=off)"
    for a, b in zip(auto, off):
        assert torch.equal(a["input_ids"], b["input_ids"])
    with pytest.raises(ValueError, match="kernel_readahead"):
        stoker.TokenLoader(tmp_path / "c", seq_len=16, kernel_readahead="never")


def test_every_token_once_over_world_sizes_and_a_resume(tmp_path):
    docs = documents(80)
    megatron_files(tmp_path / "c", docs)
    total = sum(len(d) for d in docs)

    def take(loader, limit=None):
        seen = []
        for i, batch in enumerate(loader):
            for row, ids in zip(batch["documents"], batch["input_ids"].tolist()):
                at = 0
                for _, doc, offset, length in row:
                    assert ids[at:at + length] == docs[doc][offset:offset + length].tolist()  # the document's tokens
                    seen += [(doc, offset + k) for k in range(length)]
                    at += length
            if limit is not None and i + 1 == limit:
                break
        return seen

    for world in (1, 2, 3):
        seen = []
        for rank in range(world):
            seen += take(stoker.TokenLoader(tmp_path / "c", seq_len=32, global_batch_size=6, rank=rank,
                                            world_size=world, seed=4, with_indices=True))
        assert len(seen) == total and len(set(seen)) == total

    two = [stoker.TokenLoader(tmp_path / "c", seq_len=32, global_batch_size=6, rank=r, world_size=2, seed=4,
                              with_indices=True) for r in range(2)]
    seen = take(two[0], 3) + take(two[1], 3)
    state = two[0].state_dict()
    assert state["batches_consumed"] == 3
    for rank in range(3):
        resumed = stoker.TokenLoader(tmp_path / "c", seq_len=32, global_batch_size=6, rank=rank, world_size=3, seed=4,
                                     with_indices=True)
        resumed.load_state_dict(state)
        seen += take(resumed)
    assert len(seen) == total and len(set(seen)) == total
    other = stoker.TokenLoader(tmp_path / "c", seq_len=16, global_batch_size=6, seed=4)
    with pytest.raises(ValueError, match="seq_len 32, this one has 16"):
        other.load_state_dict(state)


def test_each_pass_is_an_epoch_as_with_dataloader_and_a_resume_goes_on(tmp_path):
    megatron_files(tmp_path / "c", documents(80))
    reference = stoker.TokenLoader(tmp_path / "c", seq_len=16, batch_size=4, seed=2)
    orders = [[b["input_ids"].tolist() for b in reference] for _ in range(3)]
    loader = stoker.TokenLoader(tmp_path / "c", seq_len=16, batch_size=4, seed=2)
    for epoch in range(2):  # len(loader) next() calls a fresh iterator, its end never asked for
        it = iter(loader)
        assert [next(it)["input_ids"].tolist() for _ in range(len(loader))] == orders[epoch]
    next(iter(loader))  # a peek at epoch 2; the next pass is epoch 3 (not the rest of 2)
    assert len([b for b in loader]) == len(loader) and loader.epoch == 4
    state = None
    for i, b in enumerate(loader):  # a preempted run: stopped after 2 batches of epoch 4, saved
        if i == 1:
            state = loader.state_dict()
            break
    loader.load_state_dict(state)
    loader.set_epoch(0)
    assert [b["input_ids"].tolist() for b in loader] == orders[0]
    loader.load_state_dict(state)
    assert len([b for b in loader]) == len(loader) - 2  # the rest of epoch 4, after a load_state_dict
    loader.load_state_dict(state)
    loader.set_epoch(4)  # the epoch loop's set_epoch, right after the resume: the position stays
    assert len([b for b in loader]) == len(loader) - 2


def test_what_training_loops_read_of_a_token_loader_is_there(tmp_path, caplog):
    megatron_files(tmp_path / "c", documents(80))
    loader = stoker.TokenLoader(tmp_path / "c", seq_len=16, global_batch_size=6, world_size=3, rank=1)
    assert (loader.rank, loader.world_size, loader.global_batch_size, loader.batch_size) == (1, 3, 6, 2)
    loader.reshard(0, 4)  # 6 rows over 4 ranks: shares of 1 and 2
    assert (loader.rank, loader.world_size, loader.batch_size) == (0, 4, None)
    with caplog.at_level("INFO", logger="stoker"):
        rows = sum(b["input_ids"].shape[0] for b in loader)
    summary = loader.summary()
    assert summary.startswith("epoch 0: %d batches, %d rows, " % (len(loader), rows)) and "tokens/s" in summary
    assert summary in caplog.text  # logged at the epoch's end, as stoker.Loader's
    stats = loader.stats()
    assert stats["batches"] == len(loader) and stats["rows"] == rows
    assert 0 < stats["tokens"] <= rows * 16 and stats["remote_wait_s"] == 0


def test_inspect_and_verify_a_token_dataset(cli, tmp_path):
    # `stoker inspect PREFIX` used to fail with "No such file or directory", and the .idx with "bad magic".
    import json
    docs = [rng.integers(0, 1000, int(n)) for n in rng.integers(0, 300, 40)]
    docs[3][7] = 1000
    megatron_files(tmp_path / "c", docs, np.int32)
    lengths = np.array([len(d) for d in docs])
    for where in ("c", "c.idx", "c.bin"):
        out = json.loads(cli("inspect", tmp_path / where, "--json", "--seq-len", "64").stdout)
        assert out["format"] == "megatron" and out["prefix"] == str(tmp_path / "c") and out["token_type"] == "int32"
        assert (out["documents"], out["tokens"], out["bin_bytes"]) == (40, lengths.sum(), 4 * lengths.sum())
        assert out["empty_documents"] == (lengths == 0).sum()
        assert out["tokens_per_document"]["max"] == lengths.max() and out["tokens_per_document"]["min"] == lengths.min()
        assert out["rows"] == stoker.TokenLoader(tmp_path / "c", seq_len=64).num_rows
    text = cli("inspect", tmp_path / "c").stdout
    assert "Megatron token dataset" in text and "documents  40" in text
    ok = cli("verify", tmp_path / "c")
    assert "ids 0 to 1000 (a vocabulary of at least 1001 tokens): OK" in ok.stdout
    bad = cli("verify", tmp_path / "c", "--vocab-size", "1000", check=False)
    assert bad.returncode == 1
    assert "document 3 holds token 1000 at position 7, outside the vocabulary (vocab_size 1000)" in bad.stderr
    assert "1 problem" in bad.stdout and "1 problems" not in bad.stdout
    report = json.loads(cli("verify", tmp_path / "c", "--vocab-size", "1000", "--json", check=False).stdout)
    assert report["ok"] is False and report["problems"][0]["document"] == 3 and report["max_token"] == 1000
    stoker.write_tokens(tmp_path / "ended", [[4, 9, 0], [8, 0], [5, 6]])  # the last lacks its end token 0
    ended = cli("verify", tmp_path / "ended", "--eos", "0", check=False)
    assert ended.returncode == 1 and "document 2 ends with token 6, not the end-of-document token 0" in ended.stderr
    assert cli("verify", tmp_path / "ended").returncode == 0


def test_bench_reads_a_token_dataset_as_the_loader_does(cli, tmp_path):
    import json
    megatron_files(tmp_path / "c", documents(120))
    reference = stoker.TokenLoader(tmp_path / "c", seq_len=32, batch_size=4)
    out = cli("bench", tmp_path / "c", "--seq-len", "32", "--batch-size", "4", "--epochs", "2", "--json").stdout
    epochs = [json.loads(line) for line in out.splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:  # every token of every document, once an epoch
        assert (e["batches"], e["rows"], e["tokens"]) == (len(reference), reference.num_rows, reference.num_tokens)
        assert e["tokens_per_s"] > 0 and e["build_s"] > 0
    text = cli("bench", tmp_path / "c", "--seq-len", "32", "--batch-size", "8", "--max-batches", "3", "--consumer-ms",
               "1").stdout
    assert "epoch 0: 3 batches, 24 rows" in text and "accelerator utilization" in text
    refused = cli("bench", tmp_path / "c", "--threads", "2", "--dtype", "uint8", check=False)
    assert refused.returncode == 1 and "--threads, --dtype are for images" in refused.stderr
    listed = cli("ls", tmp_path / "c", check=False)
    assert listed.returncode == 1 and "is a Megatron token dataset: `stoker inspect" in listed.stderr


def test_bad_files_and_arguments_are_named(tmp_path):
    docs = documents(10)
    megatron_files(tmp_path / "c", docs)
    with pytest.raises(FileNotFoundError):
        stoker.TokenLoader(tmp_path / "missing", seq_len=8)
    idx = bytearray((tmp_path / "c.idx").read_bytes())
    idx[17] = 9
    (tmp_path / "bad.idx").write_bytes(bytes(idx))
    (tmp_path / "bad.bin").write_bytes((tmp_path / "c.bin").read_bytes())
    with pytest.raises(stoker.CorruptionError, match=r"bad.idx: not a valid Megatron index: unknown token type code 9"):
        stoker.TokenLoader(tmp_path / "bad", seq_len=8)
    (tmp_path / "short.idx").write_bytes((tmp_path / "c.idx").read_bytes())
    (tmp_path / "short.bin").write_bytes((tmp_path / "c.bin").read_bytes()[:-4])
    with pytest.raises(stoker.CorruptionError, match="short"):
        stoker.TokenLoader(tmp_path / "short", seq_len=8)
    with pytest.raises(ValueError, match="seq_len"):
        stoker.TokenLoader(tmp_path / "c", seq_len=0)
    with pytest.raises(ValueError, match="rank 2 is out of range for world_size 2"):
        stoker.TokenLoader(tmp_path / "c", seq_len=8, rank=2, world_size=2)
    strict = stoker.TokenLoader(tmp_path / "c", seq_len=8, vocab_size=10)
    with pytest.raises(stoker.CorruptionError, match=r"outside the vocabulary \(vocab_size 10\)"):
        next(iter(strict))


def test_blends_by_weight(tmp_path):
    a, b = documents(120), documents(40)
    megatron_files(tmp_path / "a", a)
    megatron_files(tmp_path / "b", b, np.int32)
    both = stoker.TokenLoader([tmp_path / "a", tmp_path / "b"], seq_len=16, global_batch_size=4, with_indices=True)
    seen = [(ds, doc, offset + k) for batch in both for row in batch["documents"]
            for ds, doc, offset, length in row for k in range(length)]
    assert len(seen) == len(set(seen)) == sum(map(len, a)) + sum(map(len, b))  # each token once (default weights)
    weighted = stoker.TokenLoader([tmp_path / "a", tmp_path / "b"], seq_len=16, global_batch_size=4,
                                  with_indices=True, weights=[1, 3])
    rows = [row[0][0] for batch in weighted for row in batch["documents"] if row]
    assert abs(rows.count(1) / len(rows) - 0.75) < 0.02
    with pytest.raises(ValueError, match="2 weights for 1 datasets"):
        stoker.TokenLoader(tmp_path / "a", seq_len=8, weights=[1, 2])
    with pytest.raises(ValueError, match="every weight is zero"):
        stoker.TokenLoader([tmp_path / "a", tmp_path / "b"], seq_len=8, weights=[0, 0])
    with pytest.raises(ValueError, match="weights"):
        stoker.TokenLoader([tmp_path / "a", tmp_path / "b"], seq_len=8, weights=[1, -1])


def test_device_cuda_without_a_gpu_says_so_and_stays_on_the_cpu(tmp_path, caplog):
    import logging
    megatron_files(tmp_path / "c", documents(10))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        loader = stoker.TokenLoader(tmp_path / "c", seq_len=8, device="cuda")
    if not torch.cuda.is_available():
        assert loader.device == "cpu" and "no usable CUDA device" in caplog.text
        assert next(iter(loader))["input_ids"].device.type == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        stoker.TokenLoader(tmp_path / "c", seq_len=8, device="meta")
