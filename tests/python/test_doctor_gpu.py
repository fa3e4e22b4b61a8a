"""The doctor on a fake GPU queue (known kernel durations, exact clocks):
GPU idle time attributed to the stall that caused it, launch-bound loops told
apart from compute-bound ones, and NVML's utilisation where events cannot see."""
import os
import time

import pytest

from conftest import fake_nvml_library
from stoker.doctor import Doctor
from stoker.doctor.testing import FakeClock, FakeGpuQueue


# -- on a fake GPU queue: known kernel durations, exact clocks ---------------------------------------------------

def fake_data(clock, steps, delay):
    for i in range(steps):
        clock.advance(delay)
        yield i


def fake_doctor(clock, queue, fine=False):
    return Doctor(clock=clock, gpu=queue, nvml=False, warmup_steps=0, busy_fraction=queue.busy_fraction if fine else None)


def gpu_truth(doc, queue, start):
    account = doc.account()
    busy = queue.busy_between(start, start + account["wall_s"])
    return account, busy


def test_gpu_idle_during_a_slow_loader_is_data_wait_and_queued_work_hides_part_of_it():
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = fake_doctor(clock, queue)
    for _ in doc.batches(fake_data(clock, 30, 0.050)):
        for _ in range(20):
            queue.launch(0.001)  # 20 ms of GPU work queued in 1 ms
    doc.close()
    account, busy = gpu_truth(doc, queue, 0.0)
    assert sum(account["seconds"].values()) == pytest.approx(account["wall_s"], abs=1e-9)
    assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
    # All the GPU's idle time fell in data waits: 50 ms at first, then 31 ms a step (the queue ran 19 ms into each).
    assert account["seconds"]["data_wait"] == pytest.approx(account["wall_s"] - busy, abs=1e-9)
    assert account["seconds"]["data_wait"] == pytest.approx(0.050 + 29 * 0.031, abs=1e-6)
    assert account["host_seconds"]["data_wait"] == pytest.approx(30 * 0.050, abs=1e-9)
    assert doc.verdict()[0][0].startswith("input-bound")


def test_a_data_wait_behind_a_full_queue_costs_nothing():
    clock = FakeClock()
    queue = FakeGpuQueue(clock, depth=0.040)
    doc = fake_doctor(clock, queue)
    for _ in doc.batches(fake_data(clock, 30, 0.010)):
        for _ in range(30):
            queue.launch(0.001)
    doc.close()
    account, busy = gpu_truth(doc, queue, 0.0)
    assert account["seconds"]["data_wait"] == pytest.approx(0.010, abs=1e-9)  # only the first, before any work
    assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
    assert account["host_seconds"]["data_wait"] == pytest.approx(0.300, abs=1e-9)
    assert doc.verdict() == []  # compute-bound


def test_a_synchronous_checkpoint_idles_the_gpu_for_its_write():
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = fake_doctor(clock, queue)
    for step in doc.batches(fake_data(clock, 40, 0.001)):
        for _ in range(10):
            queue.launch(0.002)
        if step % 10 == 9:
            with doc.phase("checkpoint"):
                queue.synchronize()  # torch.save of GPU tensors copies them to the host first
                clock.advance(0.200)
    doc.close()
    account, busy = gpu_truth(doc, queue, 0.0)
    assert account["seconds"]["checkpoint"] == pytest.approx(4 * 0.200, abs=1e-9)
    assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
    assert any(f.startswith("checkpoint stalls") for f, _, _ in doc.verdict())


def test_item_each_step_blocks_the_training_thread_and_the_gpu_idles_after_it():
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = fake_doctor(clock, queue, fine=True)
    for _ in doc.batches(fake_data(clock, 20, 0.0)):
        for _ in range(20):
            queue.launch(0.001)
        with doc.phase("sync"):  # loss.item()
            queue.synchronize()
        clock.advance(0.005)  # logging: no GPU work queued
    doc.close()
    account, busy = gpu_truth(doc, queue, 0.0)
    assert account["host_seconds"]["sync"] == pytest.approx(queue.sync_wait, abs=1e-9)
    assert account["seconds"]["sync"] == pytest.approx(0.0, abs=1e-9)  # the GPU computed while the host waited
    assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
    assert account["seconds"]["launch"] == pytest.approx(account["wall_s"] - busy, abs=1e-9)
    assert any(f.startswith("host synchronisation") for f, _, _ in doc.verdict())


def test_tiny_launches_are_launch_bound_with_a_busy_source_and_compute_without():
    for fine in (True, False):
        clock = FakeClock()
        queue = FakeGpuQueue(clock)
        doc = fake_doctor(clock, queue, fine=fine)
        for _ in doc.batches(fake_data(clock, 20, 0.0)):
            for _ in range(100):
                queue.launch(0.00001, host_cost=0.0001)  # 10 us kernels, 100 us apart
        doc.close()
        account, busy = gpu_truth(doc, queue, 0.0)
        if fine:
            assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
            assert account["share"]["launch"] == pytest.approx(0.9, abs=0.01)
            assert doc.verdict()[0][0].startswith("launch-bound")
        else:
            # Events alone cannot see idle time inside a step: it stays compute, and the report says so.
            assert account["share"]["compute"] == pytest.approx(1.0, abs=1e-6)
            assert any("launch gaps inside a step count as compute" in w for w in doc.cannot_see)


def test_nvml_utilisation_estimates_launch_gaps_events_cannot_see(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_NVML_LIBRARY", fake_nvml_library())
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "fake-gpu"))
    monkeypatch.setenv("FAKE_GPU_UTILIZATION", "10")
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = Doctor(clock=clock, gpu=queue, nvml=True, warmup_steps=0)
    for _ in doc.batches(fake_data(clock, 20, 0.0)):
        for _ in range(100):
            queue.launch(0.00001, host_cost=0.0001)
    time.sleep(0.35)  # a few of the sampler's 100 ms samples
    doc.close()
    account = doc.account()
    assert account["nvml_utilization"] == pytest.approx(10.0)
    assert account["share"]["launch"] == pytest.approx(0.9, abs=1e-6)
    assert "NVML utilisation (device 0, counted steps): 10%" in doc.report()


def test_nvml_that_does_not_load_is_named():
    with pytest.raises(RuntimeError, match="NVML"):
        os.environ["STOKER_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1"
        try:
            Doctor(cuda=False, nvml=True)
        finally:
            del os.environ["STOKER_NVML_LIBRARY"]


def test_pageable_copies_are_recovered_and_named():
    import torch
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = fake_doctor(clock, queue)
    for _ in doc.batches(fake_data(clock, 20, 0.001)):
        with doc.phase("h2d_copy"):
            queue.synchronize()  # a pageable copy is synchronous: it waits for the stream, then copies
            clock.advance(0.008)
        for _ in range(5):
            queue.launch(0.002)
    doc.close()
    account, busy = gpu_truth(doc, queue, 0.0)
    assert account["seconds"]["h2d_copy"] == pytest.approx(20 * 0.008, abs=1e-9)
    assert account["seconds"]["compute"] == pytest.approx(busy, abs=1e-9)
    # Tensors that batches(device=) moved from pageable memory are named in the verdict.
    real = Doctor(cuda=False, nvml=False)
    for _ in real.batches([torch.zeros(4, 4) for _ in range(3)], device="cpu"):
        pass
    real.close()
    assert real._pageable_copies == real._copies == 3
    doc._pageable_copies, doc._copies = 3, 3
    finding = [f for f in doc.verdict() if f[0].startswith("host-to-device copies")][0]
    assert "pageable" in finding[0] and "pin_memory" in finding[1]
