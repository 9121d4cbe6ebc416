"""The contract and the runtime: engine and changelog ABCs, options, serdes, plugin registry and
policy, job config, and (in later modules) the commit protocol and runners."""

__all__: list[str] = []
