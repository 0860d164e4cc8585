# SPDX-License-Identifier: Apache-2.0
"""Issue 29 through the installed package: daemon_stats() says where a sample's time goes
(waiting for its read, decoding), and a loader whose daemon reads ahead gives the same bytes as
one whose daemon does not (io_depth = 0). (That the read wait is the storage's latency, at least
a delay mount's delay per sample, is tested on a real FUSE mount in
tests/integration/storage_test.cc.)"""

from __future__ import annotations

import time

import pytest

import ringloader as rl
from conftest import TINY_COUNT, digest


def idle_stream(endpoint: str, name: str) -> dict:
    """The stream of client `name` once its ring is full and nothing fills: the daemon decodes
    nothing until the client takes a batch, so its figures stand still (bounded wait)."""
    deadline = time.monotonic() + 60
    while True:
        streams = [s for s in rl.daemon_stats(endpoint)["streams"] if s["client_name"] == name]
        assert len(streams) == 1, streams
        s = streams[0]
        if s["slots_filling"] == 0 and s["slots_ready"] + s["slots_leased"] == s["slots_total"]:
            return s
        assert time.monotonic() < deadline, f"the stream never stopped filling: {s}"
        time.sleep(0.05)


@pytest.mark.parametrize("io_depth", [256, 0])
def test_daemon_stats_count_one_read_wait_and_one_decode_per_sample_served(tiny_dataset,
                                                                           io_depth):
    """Each sample the daemon put into a batch counts one read wait and one decode: reads ahead
    of the batches (io_depth 256) add none, and a sample is counted once whichever thread read
    it. Both figures are time actually spent (> 0), and zero before any stream."""
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", ring_slots=4,
                   io_depth=io_depth) as d:
        before = rl.daemon_stats(d.endpoint)
        assert before["io_depth"] == io_depth
        assert (before["samples_read"], before["samples_decoded"]) == (0, 0)
        assert before["read_wait_seconds"] == 0 and before["decode_seconds"] == 0
        name = f"storage stats {io_depth}"
        loader = rl.Loader("tiny", endpoint=d.endpoint, batch_size=8, image_size=32,
                           output="numpy", client_name=name)
        assert sum(b.size for b in loader) == TINY_COUNT
        # The stream runs on into epoch 1 until its ring is full, then waits for the client (whose
        # releases ride on its next request: none comes). What it produced is what was counted.
        position = idle_stream(d.endpoint, name)["position"]
        produced = position["epoch"] * TINY_COUNT + position["cursor"]
        assert produced >= TINY_COUNT
        stats = rl.daemon_stats(d.endpoint)
        assert stats["samples_read"] == produced
        assert stats["samples_decoded"] == produced
        assert stats["read_wait_seconds"] > 0 and stats["decode_seconds"] > 0
        if io_depth:
            assert stats["read_ahead_peak_bytes"] > 0
        else:
            assert stats["read_ahead_peak_bytes"] == 0 and stats["reads_in_flight"] == 0
        loader.close()


def test_read_ahead_changes_no_byte(daemon, tiny_dataset):
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", io_depth=0) as plain:
        assert rl.daemon_stats(plain.endpoint)["io_depth"] == 0
        epochs = []
        for endpoint in (daemon.endpoint, plain.endpoint):
            loader = rl.Loader("tiny", endpoint=endpoint, batch_size=8, image_size=32, seed=5,
                               output="numpy")
            epochs.append([digest(b) for b in loader] + [digest(b) for b in loader])
        assert epochs[0] == epochs[1]
