"""Several GPUs of one host (parity/exec/gpus.py): pytest-xdist workers pinned one per GPU, `check --jobs`
children spread over the GPUs; on a CPU, with torch's device count faked."""

from __future__ import annotations

import os

import torch

from parity.exec import gpus


def test_xdist_gpu_index_and_visible_devices():
    assert gpus.xdist_gpu_index("gw0", 4) == 0
    assert gpus.xdist_gpu_index("gw5", 4) == 1
    assert gpus.xdist_gpu_index("gw7", 8) == 7
    for wid, n in ((None, 4), ("master", 2), ("gwx", 2), ("gw3", 0), ("", 2)):
        assert gpus.xdist_gpu_index(wid, n) is None
    assert gpus.narrowed_visible_devices("2,3", 1, 2) == "3"
    assert gpus.narrowed_visible_devices("GPU-aa, GPU-bb", 0, 2) == "GPU-aa"
    assert gpus.narrowed_visible_devices(None, 3, 4) == "3"
    assert gpus.narrowed_visible_devices("0,1,2", 1, 2) == "1"  # list and count disagree: the index


def test_pin_xdist_worker(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(i))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("DFLASH_NO_GPU_PIN", raising=False)
    assert gpus.pin_xdist_worker("gw6") == 2
    assert calls == [2] and os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert gpus.pin_xdist_worker(None) is None and calls == [2]
    monkeypatch.setenv("DFLASH_NO_GPU_PIN", "1")
    assert gpus.pin_xdist_worker("gw1") is None and calls == [2]
    monkeypatch.delenv("DFLASH_NO_GPU_PIN")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU: nothing to pin
    assert gpus.pin_xdist_worker("gw1") is None and calls == [2]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.pin_xdist_worker("gw1") is None


def test_jobs_children_take_the_least_busy_gpu():
    slots = gpus.GpuSlots(4, "4,5,6,7")
    taken = [slots.take() for _ in range(6)]
    assert taken == [0, 1, 2, 3, 0, 1]  # round-robin while all run
    slots.give_back(2)
    assert slots.take() == 2  # a GPU freed by a finished child is the next one's
    assert slots.env(3) == {"CUDA_VISIBLE_DEVICES": "7"}
    one = gpus.GpuSlots(1)
    assert one.take() is None and one.env(None) == {}  # one GPU: the children share it, env unchanged
