"""stoker.merge / `stoker merge`: datasets written apart by parallel workers
read as one, every sample exactly once; what would make the merged dataset
wrong is refused with the reason and changes nothing."""
import json
import multiprocessing
import subprocess

import pytest

import stoker


def write_part(out, worker, workers, rows, prefix="", class_names=("even", "odd"), overwrite=False):
    with stoker.DatasetWriter(out, shard_size="4KiB", class_names=list(class_names), overwrite=overwrite) as writer:
        for j in range(worker, rows, workers):
            writer.write({"__key__": "%s%06d" % (prefix, j), "cls": j % 2, "txt": "row %d" % j,
                          "score": float(j) if worker else j})  # worker 0 writes ints, the others floats


def texts_in(path):
    loader = stoker.Loader(path, batch_size=5, shuffle=False, fields={"txt": stoker.Text("txt"),
                                                                      "label": stoker.Int("cls")})
    out = []
    for batch in loader:
        out += list(zip(batch["txt"], batch["label"].tolist()))
    return out


def test_parallel_writers_merged_give_every_row_once(tmp_path, stoker_bin):
    data = tmp_path / "data"
    parts = [str(data / ("part-%05d" % i)) for i in range(3)]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=write_part, args=(parts[i], i, 3, 50)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    summary = stoker.merge(parts, data)
    assert summary["parts"] == 3 and summary["samples"] == 50 and summary["class_names"] == ["even", "odd"]
    assert summary["index"] == str(data / "index.stoker")
    rows = texts_in(data)
    assert sorted(rows) == sorted(("row %d" % j, j % 2) for j in range(50))
    assert rows[:3] == [("row 0", 0), ("row 3", 1), ("row 6", 0)], "the parts in the order given"
    # The command line checks it and reads the fields' kinds: the scores widened to float.
    verified = subprocess.run([stoker_bin, "verify", str(data)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    inspected = json.loads(subprocess.run([stoker_bin, "inspect", str(data), "--json"], capture_output=True,
                                          text=True, check=True).stdout)
    assert inspected["samples"] == 50
    assert inspected["pack"]["merged"] == {"parts": 3}, inspected["pack"]
    shown = subprocess.run([stoker_bin, "inspect", str(data)], capture_output=True, text=True, check=True).stdout
    assert "merged   from 3 parts written apart" in shown, shown
    kinds = {f["name"]: f["kind"] for f in inspected["fields"]}
    assert kinds["score"] == "float" and kinds["txt"] == "text", kinds
    # The folder moves whole.
    moved = tmp_path / "moved"
    data.rename(moved)
    assert len(texts_in(moved)) == 50


def test_the_command_line_merges_and_refuses_with_the_reason(tmp_path, stoker_bin):
    data = tmp_path / "data"
    write_part(data / "a", 0, 1, 4)
    write_part(data / "b", 0, 1, 3)  # keys 000000.. again: each worker numbered from 0
    run = subprocess.run([stoker_bin, "merge", str(data), str(data / "a"), str(data / "b")],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "sample key '000000' is in part" in run.stderr and "own keys" in run.stderr, run.stderr
    assert not (data / "index.stoker").exists()
    write_part(data / "b", 0, 1, 3, prefix="b-", overwrite=True)
    run = subprocess.run([stoker_bin, "merge", str(data), str(data / "a"), str(data / "b")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "merged 2 parts: 7 samples" in run.stdout and "2 classes" in run.stdout, run.stdout
    run = subprocess.run([stoker_bin, "merge", str(data), str(data / "a")], capture_output=True, text=True)
    assert run.returncode != 0 and "--force" in run.stderr
    run = subprocess.run([stoker_bin, "merge", "--force", str(data), str(data / "a")], capture_output=True, text=True)
    assert run.returncode == 0 and "4 samples" in run.stdout
    # A part outside the output folder, and class names that differ.
    write_part(tmp_path / "elsewhere", 0, 1, 2, prefix="e-")
    with pytest.raises(ValueError, match="not inside the output folder"):
        stoker.merge([data / "a", tmp_path / "elsewhere"], data, overwrite=True)
    write_part(data / "c", 0, 1, 2, prefix="c-", class_names=("even", "uneven"))
    with pytest.raises(ValueError, match='label 1 is "odd" against "uneven"'):
        stoker.merge([data / "a", data / "c"], data, overwrite=True)
    with pytest.raises(TypeError, match="list of dataset folders"):
        stoker.merge(str(data / "a"), data)
