"""The doctor on language-model loops: stoker.TokenLoader hooked by `stoker
doctor`, its own stats read, and its advice telling a slow store from the
hand-over of each batch to Python."""
import json
import os
import time

from stoker.doctor import Doctor, _advice


def _token_corpus(path, documents=300, seed=4):
    import numpy as np

    import stoker
    rng = np.random.default_rng(seed)
    stoker.write_tokens(path, [rng.integers(0, 30000, int(rng.integers(1, 2000))) for _ in range(documents)])
    return path


def test_stoker_doctor_hooks_the_token_loader(stoker_bin, tmp_path):
    # An LLM loop under `stoker doctor` used to end with "no Python process reported a training loop".
    import subprocess
    import sys
    corpus = _token_corpus(tmp_path / "corpus")
    script = tmp_path / "train.py"
    script.write_text(
        "import time, stoker\n"
        "loader = stoker.TokenLoader(%r, seq_len=256, batch_size=4)\n"
        "print('batches', len(loader))\n"
        "for epoch in range(2):\n"
        "    for batch in loader:\n"
        "        time.sleep(0.001)\n" % str(corpus))
    out = tmp_path / "doctor"
    run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--", sys.executable, str(script)],
                         env=dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    batches = int(run.stdout.split("batches ")[1].split()[0])
    report = json.loads(next(out.glob("rank-*.json")).read_text())
    assert report["account"]["steps"] == 2 * batches
    assert report["loader_seen"]
    assert "use stoker.Loader" not in report["report"]


def test_a_token_loader_s_wait_is_told_apart_from_its_hand_over(tmp_path):
    # Batches always ready: what the loop waits for is the hand-over of each batch to Python, and the fix says
    # so (not "raise prefetch", not "use stoker.Loader"). Packing a batch takes ~60 us and a step 2 ms; a
    # deep prefetch and a head start keep the batches ready even where other jobs share the cores (a
    # packing thread held off the CPU for a few ms made the loop wait, and the doctor rightly said so).
    import stoker
    loader = stoker.TokenLoader(_token_corpus(tmp_path / "corpus"), seq_len=128, batch_size=2, log_epochs=False,
                                prefetch=32)
    time.sleep(0.2)
    with Doctor(cuda=False, warmup_steps=0) as doc:
        for batch in doc.batches(loader):
            time.sleep(0.002)
    assert doc.account()["steps"] == len(loader)
    stats = loader.stats()
    assert stats["batches"] == len(loader) and stats["tokens"] > 0 and stats["build_s"] > 0
    fix = _advice._input_fix(doc)
    assert "hand-over of each batch" in fix, fix
    assert "epoch 0: %d batches" % len(loader) in loader.summary()


def test_a_token_loader_waiting_for_downloads_is_told_so(tmp_path):
    import remote_servers

    import stoker
    www = tmp_path / "www"
    www.mkdir()
    _token_corpus(www / "corpus", documents=200)
    server = remote_servers.Nginx(www)
    slow = remote_servers.FaultProxy(server.url, latency_s=0.05)
    try:
        loader = stoker.TokenLoader(slow.url + "/corpus", seq_len=512, batch_size=4, cache_dir=tmp_path / "cache",
                                    chunk_size="64KiB", read_ahead_batches=1, connections=1, log_epochs=False)
        with Doctor(cuda=False, warmup_steps=0) as doc:
            for batch in doc.batches(loader):
                pass
        stats = loader.stats()
        assert stats["remote_wait_s"] > 0.05 and stats["wait_s"] > 0.05, stats
        fix = _advice._input_fix(doc)
        assert "waited" in fix and "for downloads" in fix and "read_ahead_batches" in fix, fix
    finally:
        slow.close()
        server.close()
