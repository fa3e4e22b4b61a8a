"""The Python loader: torchvision parity, determinism, exact resume, torch
training loop, dtypes, corrupt samples, memory."""
import gc
import json
import io
import os
import time

import numpy as np
import pytest

import torch  # noqa: E402  (scripts/deps installs Debian's python3-torch)
import torchvision  # noqa: E402
import torchvision.transforms as tv  # noqa: E402
from PIL import Image  # noqa: E402

import stoker  # noqa: E402  (PYTHONPATH=<build>/python, set by ctest)
T = stoker.transforms


@pytest.fixture(scope="module")
def packed(cli, demo_images, tmp_path_factory):
    out = tmp_path_factory.mktemp("loader") / "packed"
    cli("pack", demo_images, out, "--shard-size", "1MiB")
    return out


def jpeg_files(root):
    return sorted(p for p in root.rglob("*.JPEG"))


def test_eval_transform_matches_torchvision_exactly(demo_images):
    for path in jpeg_files(demo_images)[:6]:
        jpeg = path.read_bytes()
        ours, _ = T.apply(jpeg, T.Compose([T.Resize(256), T.CenterCrop(224)]), dtype="uint8")
        ref = np.asarray(tv.Compose([tv.Resize(256), tv.CenterCrop(224)])(Image.open(io.BytesIO(jpeg)).convert("RGB")))
        assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= 1, path


def test_random_resized_crop_and_flip_match_torchvision_for_the_same_box(demo_images):
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()], dct_scaling=False)
    flips = 0
    for i, path in enumerate(jpeg_files(demo_images)[:12]):
        jpeg = path.read_bytes()
        ours, trace = T.apply(jpeg, transform, dtype="uint8", seed=3, sample=i)
        x0, y0, x1, y1 = (int(v) for v in trace["box"])
        img = Image.open(io.BytesIO(jpeg)).convert("RGB")
        w, h = img.size
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        area = (x1 - x0) * (y1 - y0) / (w * h)
        assert 0.07 <= area <= 1.0 and 0.74 <= (x1 - x0) / (y1 - y0) <= 1.34 or (x1 - x0, y1 - y0) in ((w, h),)
        # torchvision's F.resized_crop on a PIL image: crop, then bilinear resize.
        ref = img.crop((x0, y0, x1, y1)).resize((224, 224), Image.BILINEAR)
        if trace["flipped"]:
            ref = ref.transpose(Image.FLIP_LEFT_RIGHT)
            flips += 1
        assert np.abs(ours.numpy().astype(int) - np.asarray(ref).astype(int)).max() <= 1, path
    assert 0 < flips < 12


def test_bicubic_resize_matches_torchvision(demo_images):
    """interpolation=BICUBIC (ViT and DeiT recipes): RandomResizedCrop, Resize + CenterCrop and a Resize step
    resample with Pillow's bicubic filter, as torchvision asks it of PIL."""
    bicubic = tv.InterpolationMode.BICUBIC
    rrc = T.Compose([T.RandomResizedCrop(224, interpolation=bicubic)], dct_scaling=False)
    evaluation = T.Compose([T.Resize(256, interpolation=bicubic), T.CenterCrop(224)], dct_scaling=False)
    step = T.Compose([T.Resize((150, 170), interpolation="bicubic")], dct_scaling=False)
    unlike_bilinear = 0
    for i, path in enumerate(jpeg_files(demo_images)[:8]):
        jpeg = path.read_bytes()
        img = Image.open(io.BytesIO(jpeg)).convert("RGB")
        ours, trace = T.apply(jpeg, rrc, dtype="uint8", seed=5, sample=i)
        x0, y0, x1, y1 = (int(v) for v in trace["box"])
        ref = np.asarray(tv.functional.resized_crop(img, y0, x0, y1 - y0, x1 - x0, [224, 224], interpolation=bicubic))
        assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= 1, path
        bilinear = np.asarray(img.crop((x0, y0, x1, y1)).resize((224, 224), Image.BILINEAR))
        unlike_bilinear += np.abs(ours.numpy().astype(int) - bilinear.astype(int)).max() > 1
        ours, _ = T.apply(jpeg, evaluation, dtype="uint8")
        ref = np.asarray(tv.Compose([tv.Resize(256, interpolation=bicubic), tv.CenterCrop(224)])(img))
        assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= 1, path
        ours, _ = T.apply(jpeg, step, dtype="uint8")
        ref = np.asarray(img.resize((170, 150), Image.BICUBIC))
        assert np.abs(ours.numpy().astype(int) - ref.astype(int)).max() <= 1, path
    assert unlike_bilinear == 8  # the filter took effect
    for make in (lambda: T.RandomResizedCrop(224, interpolation="nearest"),
                 lambda: T.Compose([T.Resize(256, interpolation=tv.InterpolationMode.LANCZOS), T.CenterCrop(224)])):
        with pytest.raises(ValueError, match="is not supported"):
            make()


def test_normalize_and_dtypes(demo_images):
    jpeg = jpeg_files(demo_images)[0].read_bytes()
    mean, std = T.IMAGENET_MEAN, T.IMAGENET_STD
    base = T.Compose([T.Resize(256), T.CenterCrop(224)])
    u8, _ = T.apply(jpeg, base, dtype="uint8")
    normed = T.Compose([T.Resize(256), T.CenterCrop(224), T.Normalize(mean, std)])
    f32, _ = T.apply(jpeg, normed, dtype=torch.float32)
    ref = tv.Normalize(mean, std)(u8.permute(2, 0, 1).float() / 255)
    assert f32.shape == (3, 224, 224) and f32.dtype == torch.float32
    assert torch.allclose(f32, ref, atol=1e-6)
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        x, _ = T.apply(jpeg, normed, dtype=dtype)
        assert x.dtype == dtype
        assert torch.allclose(x.float(), ref, atol=tol, rtol=tol)


def collect(loader, limit=None):
    out = []
    for i, (images, labels, indices) in enumerate(loader):
        out.append((images.clone(), labels.clone(), indices.clone()))
        if limit is not None and i + 1 >= limit:
            break
    return out


def test_loader_yields_correct_tensors(packed, demo_images):
    loader = stoker.Loader(packed, batch_size=8, seed=0, with_indices=True, num_threads=2)
    assert len(loader) == 6  # 48 / 8
    batches = collect(loader)
    assert len(batches) == 6
    classes = sorted(p.name for p in demo_images.iterdir())
    files = jpeg_files(demo_images)
    seen = []
    for images, labels, indices in batches:
        assert images.shape == (8, 3, 224, 224) and images.dtype == torch.float32
        assert labels.dtype == torch.int64
        for label, index in zip(labels.tolist(), indices.tolist(), strict=True):
            assert classes[label] == files[index].parent.name  # pack keeps the sorted order
        seen += indices.tolist()
    assert sorted(seen) == list(range(48))
    # Normalised ImageNet-like data: roughly zero mean, unit-ish spread.
    allx = torch.cat([b[0] for b in batches])
    assert -1.0 < allx.mean().item() < 1.0 and 0.3 < allx.std().item() < 2.0


def test_same_order_and_pixels_across_thread_counts(packed):
    a = collect(stoker.Loader(packed, batch_size=8, seed=7, with_indices=True, num_threads=1))
    b = collect(stoker.Loader(packed, batch_size=8, seed=7, with_indices=True, num_threads=3, prefetch=4))
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b, strict=True):
        assert torch.equal(ia, ib) and torch.equal(ya, yb) and torch.equal(xa, xb)


def test_epochs_differ_and_set_epoch_replays(packed):
    loader = stoker.Loader(packed, batch_size=8, seed=1, with_indices=True, num_threads=2)
    e0 = torch.cat([b[2] for b in collect(loader)])
    e1 = torch.cat([b[2] for b in collect(loader)])
    assert not torch.equal(e0, e1)
    loader.set_epoch(0)
    assert torch.equal(torch.cat([b[2] for b in collect(loader)]), e0)


def epoch_order(loader):
    """The indices of one pass over ``loader``, batch by batch."""
    return torch.cat([b[2] for b in collect(loader)]).tolist()


def test_a_loop_of_len_next_calls_per_epoch_gets_whole_epochs_as_with_dataloader(packed):
    # A loop written for DataLoader: a fresh iterator each epoch, len(loader) batches from it, its end never
    # asked for. Before, the second epoch's first next() raised StopIteration inside the program's loop.
    loader = stoker.Loader(packed, batch_size=8, seed=5, with_indices=True, num_threads=2)
    reference = stoker.Loader(packed, batch_size=8, seed=5, with_indices=True, num_threads=2)
    for epoch in range(3):
        it = iter(loader)
        got = torch.cat([next(it)[2].clone() for _ in range(len(loader))]).tolist()
        assert got == epoch_order(reference), epoch
        assert sorted(got) == list(range(48))
    # Epoch 2's end not asked for yet; epoch 1's was summarised when the third pass began.
    assert loader.epoch == 2 and loader.state_dict()["batches_consumed"] == 6
    assert loader.summary().startswith("epoch 1: 6 batches, 48 images")


def test_a_pass_after_one_left_unfinished_is_the_next_whole_epoch(packed, caplog):
    import itertools
    caplog.set_level("INFO", logger="stoker")
    loader = stoker.Loader(packed, batch_size=8, seed=2, with_indices=True, num_threads=2, log_epochs=False)
    reference = stoker.Loader(packed, batch_size=8, seed=2, with_indices=True, num_threads=2)
    orders = [epoch_order(reference) for _ in range(4)]
    peeked = next(iter(loader))[2].tolist()  # a peek at epoch 0
    assert peeked == orders[0][:8]
    assert epoch_order(loader) == orders[1]  # not epoch 0's other 5 batches
    assert sum(1 for _ in itertools.islice(loader, len(loader))) == 6  # all of epoch 2, its end not asked for
    assert epoch_order(loader) == orders[3]  # not an empty pass
    for _ in zip(range(2), loader):  # a loop broken off: the next pass is epoch 5, from its start
        pass
    assert loader.epoch == 4
    assert len(epoch_order(loader)) == 48 and loader.epoch == 6
    # The first epoch left unfinished (the peek's) is said, once; a whole epoch without its end is not.
    said = [r.getMessage() for r in caplog.records if "a loop left epoch" in r.getMessage()]
    assert said == ["a loop left epoch 0 after 1 of its 6 batches; the next loop starts epoch 1, as with DataLoader "
                    "(load_state_dict() of a saved position goes on from there instead; said once)"]


def test_a_pass_after_set_epoch_or_load_state_dict_starts_where_they_placed_the_loader(packed):
    loader = stoker.Loader(packed, batch_size=8, seed=4, with_indices=True, num_threads=2)
    whole = epoch_order(stoker.Loader(packed, batch_size=8, seed=4, with_indices=True, num_threads=2))
    first = [i for b in collect(loader, limit=2) for i in b[2].tolist()]  # a preempted run: 2 batches, then saved
    state = loader.state_dict()
    resumed = stoker.Loader(packed, batch_size=8, seed=4, with_indices=True, num_threads=2)
    resumed.load_state_dict(state)
    assert first + epoch_order(resumed) == whole  # a resumed run goes on exactly where it stopped
    loader.load_state_dict(state)  # the same loader, placed back at its own position
    assert first + epoch_order(loader) == whole
    collect(loader, limit=1)
    loader.set_epoch(0)  # set_epoch after an unfinished pass: that epoch, from its start
    assert epoch_order(loader) == whole


def test_the_readmes_loop_resumed_mid_epoch_trains_each_sample_once(packed):
    # set_epoch(epoch) at every epoch's start, also the resumed one: before, it started that epoch again and
    # trained its first batches twice.
    def make():
        return stoker.Loader(packed, batch_size=8, seed=6, with_indices=True, num_threads=2)
    first, seen = make(), []
    for epoch in range(2):
        first.set_epoch(epoch)
        for i, (_, _, idx) in enumerate(first):
            seen += idx.tolist()
            if epoch == 1 and i == 2:
                state = first.state_dict()  # preempted after 3 batches of epoch 1
                break
    resumed = make()
    resumed.load_state_dict(state)
    for epoch in range(resumed.epoch, 3):
        resumed.set_epoch(epoch)
        for _, _, idx in resumed:
            seen += idx.tolist()
    assert [sorted(seen[e * 48:(e + 1) * 48]) for e in range(3)] == [list(range(48))] * 3
    other = make()
    other.load_state_dict(state)
    other.set_epoch(2)  # another epoch than the restored position's: that epoch, from its start
    assert epoch_order(other) == seen[96:]


@pytest.mark.parametrize("w1,w2", [(4, 2), (2, 3)])
def test_exact_resume_under_world_size_change(packed, w1, w2):
    global_batch = 12
    reference = stoker.Loader(packed, batch_size=global_batch, seed=3, with_indices=True, world_size=1, rank=0,
                              drop_last=True, num_threads=2)
    full = torch.cat([b[2] for b in collect(reference)]).tolist()  # the epoch's order, 4 global batches
    seen, state = [], None
    for rank in range(w1):
        loader = stoker.Loader(packed, batch_size=global_batch // w1, seed=3, with_indices=True, world_size=w1,
                               rank=rank, drop_last=True, num_threads=2, prefetch=3)
        for _, _, idx in collect(loader, limit=2):  # 2 consumed, more prefetched
            seen += idx.tolist()
        state = loader.state_dict()
    assert state["batches_consumed"] == 2
    for rank in range(w2):
        loader = stoker.Loader(packed, batch_size=global_batch // w2, seed=3, with_indices=True, world_size=w2,
                               rank=rank, drop_last=True, num_threads=2)
        loader.load_state_dict(state)
        for _, _, idx in collect(loader):
            seen += idx.tolist()
    assert sorted(seen) == sorted(full)
    assert len(set(seen)) == len(seen) == 48


def test_drops_into_a_torch_training_loop(packed):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 6))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = stoker.Loader(packed, batch_size=16, seed=0, num_threads=2,
                           transform=T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                                                T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]))
    losses = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert len(losses) == 9 and all(np.isfinite(losses))
    stats = loader.stats()
    assert stats["batches"] == 9 and stats["samples"] == 144
    assert loader.summary().startswith("epoch 2: 3 batches, 48 images")


def test_what_dataloader_code_reads_of_a_loader_is_there(packed, demo_images):
    # PyTorch's quickstart train loop reads len(dataloader.dataset); others read batch_size and drop_last, and
    # classification scripts ImageFolder's classes.
    loader = stoker.Loader(packed, batch_size=8, seed=0, num_threads=2, drop_last=True, world_size=2, rank=1)
    assert (len(loader.dataset), loader.batch_size, loader.drop_last) == (48, 8, True)
    reference = torchvision.datasets.ImageFolder(demo_images)
    assert loader.dataset.classes == reference.classes and loader.dataset.class_to_idx == reference.class_to_idx
    loose = stoker.Loader(demo_images, batch_size=8, num_threads=1)
    assert loose.dataset.classes == reference.classes
    assert loader.dataset.location == os.fspath(packed) and "48 samples" in repr(loader.dataset)
    seen = sum(len(labels) for _, labels in loader)
    assert seen == len(loader) * loader.batch_size == len(loader.dataset) // 2
    elastic = stoker.Loader(packed, global_batch_size=12, world_size=2, rank=0, num_threads=1)
    assert elastic.batch_size is None and elastic.drop_last is False and len(elastic.dataset) == 48


def test_a_ddp_loop_s_sampler_calls_work_as_written(packed):
    # DDP loops written for DistributedSampler call loader.sampler.set_epoch(epoch) (timm) and compare
    # len(loader.sampler) * world_size with len(loader.dataset) (torch's ImageNet example): AttributeError before.
    reference = stoker.Loader(packed, batch_size=5, seed=3, num_threads=1, world_size=3, rank=2, log_epochs=False)
    orders = []
    for epoch in range(2):
        reference.set_epoch(epoch)
        orders.append([labels.tolist() for _, labels in reference])
    loader = stoker.Loader(packed, batch_size=5, seed=3, num_threads=1, world_size=3, rank=2, log_epochs=False)
    for epoch in (1, 0):
        loader.sampler.set_epoch(epoch)
        assert loader.sampler.epoch == epoch
        assert [labels.tolist() for _, labels in loader] == orders[epoch]
    # 48 samples, global batch 15: three full batches and one of 3, padded to 3 (one a rank), as DistributedSampler.
    assert len(loader.sampler) == 3 * 5 + 1 == sum(len(x) for x in orders[0])
    assert len(loader.sampler) * 3 >= len(loader.dataset)
    dropped = stoker.Loader(packed, batch_size=5, num_threads=1, world_size=3, rank=0, drop_last=True)
    assert len(dropped.sampler) == 15
    elastic = stoker.Loader(packed, global_batch_size=15, world_size=4, rank=3, num_threads=1, log_epochs=False)
    assert len(elastic.sampler) == sum(len(labels) for _, labels in elastic)  # shares of 15 and 3 over 4 ranks
    with pytest.raises(TypeError, match="no indices to iterate"):
        iter(loader.sampler)


def test_tensors_outlive_the_loader(packed):
    loader = stoker.Loader(packed, batch_size=8, seed=0, num_threads=2, prefetch=3)
    images, labels = next(iter(loader))
    copy = images.clone()
    del loader
    gc.collect()
    assert torch.equal(images, copy)  # the buffer stays valid while a tensor uses it
    del images, labels
    gc.collect()


def test_errors_become_python_exceptions(packed, tmp_path):
    with pytest.raises(FileNotFoundError):
        stoker.Loader(tmp_path / "nothing-here")
    with pytest.raises(ValueError, match="world_size"):
        stoker.Loader(packed, batch_size=4, rank=3, world_size=3)
    with pytest.raises(ValueError, match="dtype"):
        stoker.Loader(packed, dtype="int32")
    with pytest.raises(ValueError, match="CenterCrop"):
        T.Compose([T.Resize(256)])
    loader = stoker.Loader(packed, batch_size=8)
    state = loader.state_dict()
    state["global_batch_size"] = 16
    with pytest.raises(ValueError, match="global batch"):
        loader.load_state_dict(state)


def test_kernel_readahead_is_chosen_said_and_can_be_forced(packed, caplog):
    # The shards fit this machine's page cache: auto keeps the kernel's read-ahead, silently.
    with caplog.at_level("INFO", logger="stoker"):
        auto = stoker.Loader(packed, batch_size=8, transform=T.Compose([T.Resize(64), T.CenterCrop(64)]))
    stats = auto.stats()
    assert stats["kernel_readahead"] is True
    assert "fit the page cache" in stats["readahead_note"], stats["readahead_note"]
    assert "read-ahead" not in caplog.text
    off = stoker.Loader(packed, batch_size=8, kernel_readahead="off",
                        transform=T.Compose([T.Resize(64), T.CenterCrop(64)]))
    assert off.stats()["kernel_readahead"] is False
    assert off.stats()["readahead_note"] == "kernel read-ahead off for the shards (kernel_readahead=off)"
    # Same batches either way: a hint to the kernel, not a change in what is read.
    for (a, la), (b, lb) in zip(auto, off):
        assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(ValueError, match="kernel_readahead"):
        stoker.Loader(packed, kernel_readahead="sometimes")


def test_corrupt_sample_policies(cli, demo_images, tmp_path):
    files = jpeg_files(demo_images)[:10]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(files[0].read_bytes()[:2000])  # a truncated JPEG
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\n" + "".join("%s,%d\n" % (f, i % 2) for i, f in enumerate(files)) + "%s,1\n" % bad)
    cli("pack", manifest, tmp_path / "packed")
    loader = stoker.Loader(tmp_path / "packed", batch_size=4, shuffle=False)
    with pytest.raises(stoker.CorruptionError, match=r"sample '.*bad'.*shard-000000.tar:\d+"):
        for _ in loader:
            pass
    loader = stoker.Loader(tmp_path / "packed", batch_size=4, shuffle=False, on_corrupt="skip", with_indices=True)
    batches = collect(loader)
    assert sum(b[0].shape[0] for b in batches) == 11
    assert loader.stats()["corrupt_skipped"] == 1


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_memory_is_flat_across_epochs(packed):
    loader = stoker.Loader(packed, batch_size=8, seed=0, num_threads=2)
    for _ in loader:
        pass
    gc.collect()
    after_first = rss_bytes()
    for _ in range(4):
        for _ in loader:
            pass
    gc.collect()
    growth = rss_bytes() - after_first
    assert growth < 8 << 20, "RSS grew by %d bytes over 4 epochs" % growth


def test_a_training_loop_touches_two_batch_buffers(packed):
    # The loop holds its batch while it asks for the next: under the
    # automatic depth the loader decodes ahead only into the two buffers
    # that takes (16 samples for its thread), with the same batches.
    def run(**kwargs):
        loader = stoker.Loader(packed, batch_size=16, seed=3, num_threads=1, with_indices=True, log_epochs=False,
                               **kwargs)
        seen = []
        for _ in range(4):
            for images, labels, indices in loader:
                seen.append((indices.clone(), images.sum().item()))
        return loader, seen
    automatic, got = run()
    explicit, want = run(prefetch=2)
    assert len(got) == len(want) == 4 * len(automatic)
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, want))
    assert automatic.stats()["batch_buffers_touched"] == 2
    assert explicit.stats()["batch_buffers_touched"] == 3


def test_loose_image_folder_reads_like_its_packed_shards(packed, demo_images, cli):
    kwargs = dict(batch_size=8, seed=4, with_indices=True, num_threads=2,
                  transform=T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()]))
    from_packed = [tuple(t.clone() for t in b) for b in stoker.Loader(packed, **kwargs)]
    from_loose = [tuple(t.clone() for t in b) for b in stoker.Loader(demo_images, **kwargs)]
    assert len(from_packed) == len(from_loose) == 6
    for (xa, ya, ia), (xb, yb, ib) in zip(from_packed, from_loose, strict=True):
        assert torch.equal(ia, ib) and torch.equal(ya, yb) and torch.equal(xa, xb)
    result = cli("bench", demo_images, "--max-batches", "2", "--batch-size", "8", "--size", "32", "--json")
    assert "reading it as an ImageFolder of loose files" in result.stderr
    assert json.loads(result.stdout.splitlines()[0])["images"] == 16


def test_cuda_request_falls_back_to_cpu_with_a_warning_where_there_is_no_gpu(packed, caplog):
    if stoker.cuda_status()["device_count"] > 0:
        pytest.skip("this machine has a GPU")
    with caplog.at_level("WARNING", logger="stoker"):
        loader = stoker.Loader(packed, batch_size=4, device="cuda", num_threads=1,
                               transform=T.Compose([T.RandomResizedCrop(32)]))
    assert loader.device == "cpu" and not loader.gpu_preprocess
    assert any("using the CPU" in r.getMessage() for r in caplog.records)
    assert not stoker.Loader(packed, batch_size=4, device="cuda", gpu_preprocess=True).gpu_preprocess
    images, labels = next(iter(loader))
    assert images.device.type == "cpu" and images.shape == (4, 3, 32, 32)
    with pytest.raises(ValueError, match="not 'cpu', 'cuda' or 'cuda:N'"):
        stoker.Loader(packed, device="tpu")


def test_gpu_decode_without_a_gpu_decodes_on_the_cpu_and_says_so(packed, caplog):
    if stoker.cuda_status()["device_count"] > 0:
        pytest.skip("this machine has a GPU")
    tf = T.Compose([T.Resize(40), T.CenterCrop(32)])
    with caplog.at_level("WARNING", logger="stoker"):
        loader = stoker.Loader(packed, batch_size=4, device="cuda", decode="gpu", num_threads=1, transform=tf,
                               shuffle=False)
    assert loader.device == "cpu" and loader.decoder == "cpu"
    assert any("decode='gpu' needs a CUDA device" in r.getMessage() for r in caplog.records)
    reference = stoker.Loader(packed, batch_size=4, num_threads=1, transform=tf, shuffle=False)
    for (a, _), (b, _) in zip(loader, reference):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="decode"):
        stoker.Loader(packed, decode="nvjpeg")


def test_autotune_starts_low_and_logs_its_decisions(packed):
    tf = T.Compose([T.RandomResizedCrop(32)])
    loader = stoker.Loader(packed, batch_size=2, num_threads="auto", autotune_max_threads=2, transform=tf,
                           log_epochs=False, shuffle=False)
    reference = stoker.Loader(packed, batch_size=2, num_threads=1, transform=tf, log_epochs=False, shuffle=False)
    for _ in range(3):
        tuned, fixed = iter(loader), iter(reference)
        for a, _ in tuned:
            b, _ = next(fixed)
            assert torch.equal(a, b)  # whatever the tuner does, the batches are the same
        with pytest.raises(StopIteration):
            next(fixed)
    stats = loader.stats()
    assert stats["autotune"] and 1 <= stats["threads"] <= 2
    assert len(loader.autotune_log()) >= stats["autotune_changes"]
    assert "autotune:" in loader.summary()
    with pytest.raises(ValueError, match="autotune_max_threads and autotune_memory need"):
        stoker.Loader(packed, autotune_max_threads=2)
    with pytest.raises(ValueError, match="autotune_memory_bytes"):
        stoker.Loader(packed, batch_size=4, num_threads="auto", autotune_memory="1KiB", transform=tf)


def test_autotune_adds_a_thread_when_one_cannot_keep_up_and_keeps_to_its_budgets(packed):
    # Batches of 8 at 224 px take one thread tens of ms; the loop computes 1 ms a step: one thread cannot keep up.
    tf = T.Compose([T.RandomResizedCrop(224)])
    budget = 5 * 8 * 3 * 224 * 224 * 4 + 1000  # five float32 batch buffers: prefetch at most 3
    loader = stoker.Loader(packed, batch_size=8, num_threads="auto", autotune_max_threads=2, autotune_memory=budget,
                           transform=tf, log_epochs=False)
    steps = 0
    while steps < 48:
        for _ in loader:
            time.sleep(0.001)
            steps += 1
    stats = loader.stats()
    assert stats["threads"] == 2, loader.autotune_log()
    assert stats["prefetch"] <= 3
    assert "threads 1 -> 2" in loader.autotune_log()[0]
