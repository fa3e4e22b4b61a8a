"""The Python package against misuse: every bad argument is a TypeError or
ValueError naming the parameter; a loader iterated from two threads, used
after fork, or interrupted by Ctrl-C behaves; checkpoints whose structure
names a missing tensor say so."""
import math
import os
import signal
import threading
import time

import pytest
import torch  # noqa: E402
import torchvision.transforms as tv  # noqa: E402

import stoker  # noqa: E402
T = stoker.transforms


@pytest.fixture(scope="module")
def packed(cli, demo_images, tmp_path_factory):
    out = tmp_path_factory.mktemp("misuse") / "packed"
    cli("pack", demo_images, out, "--shard-size", "1MiB")
    return out


@pytest.mark.parametrize("kwargs, error, says", [
    (dict(batch_size=2.7), TypeError, "batch_size must be an integer, not 2.7"),
    (dict(batch_size=-1), ValueError, "batch_size must be at least 1"),
    (dict(batch_size="64"), TypeError, "batch_size must be an integer"),
    (dict(world_size=0), ValueError, "world_size must be at least 1"),
    (dict(world_size=-1), ValueError, "world_size must be at least 1"),
    (dict(rank=-1), ValueError, "rank must be at least 0"),
    (dict(rank=2, world_size=2), ValueError, "rank 2 is out of range for world_size 2"),
    (dict(seed=-1), ValueError, "seed must be at least 0"),
    (dict(num_threads=100000), ValueError, "num_threads must be at most 1024"),
    (dict(prefetch=1000), ValueError, "prefetch must be at most 64"),
    (dict(connections=0), ValueError, "connections must be at least 1"),
    (dict(max_attempts=0), ValueError, "max_attempts must be at least 1"),
    (dict(stall_timeout_seconds=float("nan")), ValueError, "stall_timeout_seconds must be a finite number"),
    (dict(order="random"), ValueError, "order must be one of"),
    (dict(transform=tv.Compose([tv.RandomResizedCrop(224)])), TypeError, "torchvision.transforms"),
    # DataLoader's own arguments, from a program ported to stoker: what stands for each.
    (dict(num_workers=8, pin_memory=True), TypeError, "stoker.Loader does not take DataLoader's 'num_workers', "
     "'pin_memory'; in stoker: num_workers -> num_threads=N"),
    (dict(sampler=None), TypeError, "sampler -> shuffle=, seed=, order= and rank=/world_size="),
    (dict(shufle=True), TypeError, "stoker.Loader got unexpected keyword argument 'shufle'"),
])
def test_bad_arguments_name_the_parameter(packed, kwargs, error, says):
    with pytest.raises(error, match=None) as info:
        stoker.Loader(packed, **kwargs)
    assert says in str(info.value), str(info.value)


def test_the_token_loader_says_what_stands_for_dataloaders_arguments(tmp_path):
    stoker.write_tokens(tmp_path / "c", [[1, 2, 3, 4, 5]])
    with pytest.raises(TypeError, match="num_workers -> nothing: rows are read and packed on the loader's own"):
        stoker.TokenLoader(tmp_path / "c", seq_len=2, batch_size=1, num_workers=4)


def test_a_shard_gone_or_rewritten_after_packing_is_named_when_the_loader_is_made(cli, demo_images, tmp_path):
    cli("pack", demo_images, tmp_path / "p", "--shard-size", "1MiB")
    shards = sorted((tmp_path / "p").glob("shard-*.tar"))
    os.truncate(shards[-1], 4096)
    with pytest.raises(stoker.CorruptionError, match=r"'%s' is 4096 bytes, the index says" % shards[-1].name):
        stoker.Loader(tmp_path / "p", batch_size=8)
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the %d shards that index .* names cannot be opened: '%s'"
                       % (len(shards), shards[-1].name)):
        stoker.Loader(tmp_path / "p", batch_size=8, on_corrupt="skip")


def test_a_dataset_that_is_not_there_is_named_as_missing(cli, tmp_path):
    for command in ("inspect", "verify", "ls", "bench"):
        r = cli(command, tmp_path / "nowhere", check=False)
        assert r.returncode == 1 and "no dataset at '%s': nothing by that name" % (tmp_path / "nowhere") in r.stderr, (
            command, r.stderr)
    with pytest.raises(FileNotFoundError, match="no dataset at '.*/nowhere/index.stoker': nothing by that name"):
        stoker.Loader(tmp_path / "nowhere" / "index.stoker", batch_size=8)


def test_bad_transform_values_and_states_are_named(packed):
    for mean, std in (((math.nan, 0.5, 0.5), (1, 1, 1)), ((0, 0, 0), (1, math.inf, 1)), ((0, 0, 0), (1, -1, 1))):
        with pytest.raises(ValueError, match="finite"):
            T.Normalize(mean, std)
    loader = stoker.Loader(packed, batch_size=8, log_epochs=False)
    good = loader.state_dict()
    for bad, says in ((dict(good, epoch="one"), "state['epoch'] must be an integer"),
                      (dict(good, batches_consumed=-3), "state['batches_consumed'] must be at least 0"),
                      ({k: v for k, v in good.items() if k != "seed"}, "lacks seed"),
                      (dict(good, extra=1), "unknown keys extra"),
                      ([1, 2], "must be a dict")):
        with pytest.raises((TypeError, ValueError)) as info:
            loader.load_state_dict(bad)
        assert says in str(info.value), str(info.value)
    loader.load_state_dict(good)  # still fine afterwards
    with pytest.raises(TypeError, match="epoch must be an integer"):
        loader.set_epoch(1.5)
    # A Compose ported from torchvision: a step stoker has under the same name is named as such.
    with pytest.raises(ValueError, match=r"this ColorJitter is torchvision's; stoker's Compose takes "
                                         r"stoker.transforms.ColorJitter"):
        T.Compose([T.RandomResizedCrop(224), tv.ColorJitter(0.4, 0.4, 0.4)])
    with pytest.raises(ValueError, match="stoker does not compile Lambda"):
        T.Compose([T.RandomResizedCrop(224), tv.Lambda(lambda x: x)])


def test_two_threads_iterating_one_loader_share_its_batches(packed):
    loader = stoker.Loader(packed, batch_size=4, with_indices=True, num_threads=2, log_epochs=False)
    seen, errors = [], []
    lock = threading.Lock()

    def consume():
        try:
            for _, _, indices in loader:
                with lock:
                    seen.extend(indices.tolist())
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # Together they read at least the first epoch; no batch reached both.
    assert len(seen) >= 48


def test_a_forked_child_is_told_to_make_its_own_loader(packed, tmp_path):
    # The token loader's child used to wait forever for batches from a thread the fork did not copy.
    stoker.write_tokens(tmp_path / "corpus", [list(range(1, 40))] * 30)
    loaders = {"Loader": stoker.Loader(packed, batch_size=8, log_epochs=False),
               "TokenLoader": stoker.TokenLoader(tmp_path / "corpus", seq_len=16, batch_size=8)}
    for name, loader in loaders.items():
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                next(iter(loader))
            except RuntimeError as e:
                code = 0 if "forked child" in str(e) and "stoker.%s" % name in str(e) else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child of a stoker.%s hung" % name)
            time.sleep(0.01)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (name, status)
    assert next(iter(loaders["Loader"]))[0].shape[0] == 8  # the parents' loaders work
    assert next(iter(loaders["TokenLoader"]))["input_ids"].shape == (8, 16)


def test_a_structure_naming_a_missing_tensor_is_a_corruption_error(tmp_path):
    ck = stoker.Checkpointer(tmp_path / "ck", keep_last=0)
    ck.save(1, {"model": {"w": torch.ones(3), "b": torch.zeros(2)}})
    ck.wait()
    del ck
    manifest = tmp_path / "ck" / "step-1" / "manifest.json"
    text = manifest.read_text().replace('model.b', 'model.gone')
    manifest.write_text(text)
    with pytest.raises(stoker.CorruptionError, match="names tensor 'model.gone', which none of its files holds"):
        stoker.load_latest(tmp_path / "ck")
