"""Tar shards in the WebDataset layout: packing them, and streaming them from local disks or HTTP(S) servers.

- :mod:`~paddletrain.data.shards.layout`: member names, samples, and the checks a shard from elsewhere must pass;
- :mod:`~paddletrain.data.shards.index`: the index ``pack`` writes (checksums, sample offsets, class names);
- :mod:`~paddletrain.data.shards.pack`: ``python -m paddletrain.data pack``;
- :mod:`~paddletrain.data.shards.order`: an epoch's order, a pure function of (seed, epoch), local in its reads;
- :mod:`~paddletrain.data.shards.source`: URL patterns and HTTP reads with retries, timeouts and a deadline;
- :mod:`~paddletrain.data.shards.cache`: the bounded, verified, least-recently-used cache of remote shards;
- :mod:`~paddletrain.data.shards.dataset`: ``data=shards`` (the only one of them that needs Paddle).
"""
