"""The engine side: ``sdk.SdkEngine`` over a dialect per SDK (``docker_dialect``, ``podman_dialect``),
its errors, pulls, retries, ssh endpoints, and the attach and exec streams to a container."""
