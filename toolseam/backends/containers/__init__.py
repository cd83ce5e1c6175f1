"""The container wing: one backend over any engine that speaks the docker API family.

* ``backend`` — ``ContainerBackend`` (what ``docker.py`` and ``podman.py`` present), ``MODES``
  and the mode rule; ``options`` — ``ContainerOptions``, frozen and validated once;
* ``sandbox`` — ``ContainerSandbox``, the lifecycle both workspace modes share, the ``Engine``
  protocol, the janitor; ``bind`` / ``copy`` — the two workspace modes, chosen once, each with
  its liveness; ``workspace_copy`` — copy mode's tar in and copy-back out; ``attach`` / ``ssh`` —
  copy mode's channel and tunnels; ``recover`` — work kept after a failed copy-back;
* ``engine`` — ``SdkEngine``, the ONE engine implementation, over a small per-SDK dialect
  (``docker_dialect`` / ``podman_dialect``, each importing its SDK, an extra); ``errors`` — the
  typed engine errors, mapped once; ``pull`` and ``retry``;
* ``bundle`` / ``bundle_arch`` — the agent's runtime bundle for any image, and for another CPU.

A third engine is one dialect module and one row in ``backends/__init__.py``; a third
workspace mode is one module and one row in ``backend.MODES``.
"""
