"""What the benchmarks of several folders use.

- :mod:`.report`: Markdown tables, sections and documents; progress on stderr.
- :mod:`.stats`: percentiles of latency samples.
- :mod:`.timing`: timing loops that alternate the variants of a hit chunk by chunk.
- :mod:`.servers`: which redis-server binary a peer needs, and its version.
- :mod:`.workload`: the value cached, the keys' prefix, the clean-up of a run's keys.
- :mod:`.phase`: one measured run of one peer, and what the herd's workers record of it.
- :mod:`.installed`: whether a peer's package is installed.
"""
