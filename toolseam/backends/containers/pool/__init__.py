"""Warm pools of containers: ``warm.ContainerPool`` and the host mounts behind a pool in bind
mode (``mounts``)."""
