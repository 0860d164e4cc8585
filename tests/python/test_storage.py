"""Issue 29 through the installed package: daemon_stats() says where a sample's time goes
(waiting for its read, decoding), and a loader whose daemon reads ahead gives the same bytes as
one whose daemon does not (io_depth = 0)."""

from __future__ import annotations

import ringloader as rl
from conftest import TINY_COUNT, digest


def test_daemon_stats_split_read_wait_and_decode(daemon):
    loader = rl.Loader("tiny", endpoint=daemon.endpoint, batch_size=8, image_size=32,
                       output="numpy")
    assert sum(b.size for b in loader) == TINY_COUNT
    stats = rl.daemon_stats(daemon.endpoint)
    assert stats["io_depth"] == 256
    assert stats["samples_read"] >= TINY_COUNT
    assert stats["samples_decoded"] >= TINY_COUNT
    assert stats["read_wait_seconds"] >= 0 and stats["decode_seconds"] > 0


def test_read_ahead_changes_no_byte(daemon, tiny_dataset):
    with rl.Daemon(datasets={"tiny": tiny_dataset}, memory_limit="1GiB", io_depth=0) as plain:
        assert rl.daemon_stats(plain.endpoint)["io_depth"] == 0
        epochs = []
        for endpoint in (daemon.endpoint, plain.endpoint):
            loader = rl.Loader("tiny", endpoint=endpoint, batch_size=8, image_size=32, seed=5,
                               output="numpy")
            epochs.append([digest(b) for b in loader] + [digest(b) for b in loader])
        assert epochs[0] == epochs[1]
