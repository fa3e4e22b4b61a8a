"""stoker.order_quality: how close an order's batches come to a global
shuffle's, on a crafted order and on a packed ImageFolder tree (shards hold
one class or two: a shard-aware order's batches have few labels)."""
import math
import subprocess

import numpy as np
import pytest

import stoker
from stoker.order_quality import measure


@pytest.fixture(scope="module")
def packed(tmp_path_factory, demo_images, stoker_bin):
    out = tmp_path_factory.mktemp("quality") / "packed"
    subprocess.run([stoker_bin, "pack", str(demo_images), str(out), "--shard-size", "256KiB"], check=True,
                   capture_output=True)
    return out


def test_measures_of_a_crafted_order():
    labels = [0, 0, 1, 1, 2, 2, 3, 3]
    shard_of = [0, 0, 0, 0, 1, 1, 1, 1]
    by_class = measure(list(range(8)), labels, shard_of, batch_size=2)
    assert by_class["label_entropy_bits"] == 0 and by_class["labels_per_batch"] == 1
    assert by_class["shards_per_batch"] == 1 and by_class["mean_jump"] == 1
    mixed = measure([0, 2, 4, 6, 1, 3, 5, 7], labels, shard_of, batch_size=2)
    assert mixed["label_entropy_bits"] == 1 and mixed["labels_per_batch"] == 2
    assert mixed["shards_per_batch"] == 1  # (0,2) (1,3) in shard 0, (4,6) (5,7) in shard 1
    assert math.isclose(mixed["mean_jump"], (2 + 2 + 2 + 5 + 2 + 2 + 2) / 7)
    # Ratios to a global shuffle of the same samples are given beside.
    assert mixed["label_entropy_bits_global"] > 0
    assert math.isclose(mixed["label_entropy_bits_vs_global"],
                        mixed["label_entropy_bits"] / mixed["label_entropy_bits_global"])


def test_a_global_shuffle_scores_near_one_and_shard_block_on_class_ordered_shards_does_not(packed):
    shuffled = stoker.order_quality(packed, order="shuffle", batch_size=8, seed=1)
    assert 0.8 < shuffled["label_entropy_bits_vs_global"] < 1.2, shuffled
    assert 0.6 < shuffled["mean_jump_vs_global"] < 1.4, shuffled  # 48 samples: one permutation against another
    one = stoker.order_quality(packed, order="shard_block", shard_window=1, batch_size=8)
    assert one["shard_window"] == 1 and one["samples"] == 48
    # Packed from an ImageFolder tree in class order, a shard holds one or two classes.
    assert one["labels_per_batch"] < shuffled["labels_per_batch"], (one, shuffled)
    assert one["label_entropy_bits_vs_global"] < 0.8, one
    assert one["shards_per_batch"] < shuffled["shards_per_batch"], (one, shuffled)
    wide = stoker.order_quality(packed, order="shard_block", shard_window=8, batch_size=8)
    assert wide["label_entropy_bits"] > one["label_entropy_bits"], (wide, one)
    sequential = stoker.order_quality(packed, order="sequential", batch_size=8)
    assert sequential["mean_jump"] == 1


def test_order_auto_is_refused_with_what_to_pass_instead(packed):
    with pytest.raises(ValueError, match="stats\\(\\)\\['order'\\]"):
        stoker.order_quality(packed, order="auto")
