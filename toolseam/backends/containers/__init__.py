"""The container wing: one backend over any engine that speaks the docker API family.

* ``backend`` — ``ContainerBackend`` (what ``docker.py`` and ``podman.py`` present), ``MODES``,
  ``LIFETIMES`` and the mode rule; ``options`` — ``ContainerOptions``, frozen and validated once;
* ``sandbox`` — ``ContainerSandbox``, the lifecycle both workspace modes share; ``labels`` —
  the names it leaves on the engine and the host; ``janitor`` — what dead sessions left behind;
* ``modes/`` — ``bind`` and ``copy``, chosen once, each with its liveness; ``lifetimes/`` —
  ``ephemeral`` and ``durable``, the hooks a mode asks of how long the sandbox lives, chosen
  once: any mode with any lifetime;
* ``workspace_sync/`` — copy mode's tar in and copy-back out (``tar_sync``, ``apply``,
  ``policy``, ``host_ops``); ``recover`` — work kept after a failed copy-back;
* ``engine/`` — ``protocol`` (what the sandbox asks of an engine), ``sdk.SdkEngine``, the ONE
  engine implementation, over a small per-SDK dialect (``docker_dialect`` / ``podman_dialect``,
  each importing its SDK, an extra); ``errors``, ``pull``, ``retry``, ``ssh``, and the
  ``attach``/``exec_stream`` channels;
* ``bundle/`` — the agent's runtime bundle for any image (``staged``), and for another CPU
  (``foreign_arch``); ``pool/`` — warm pools (``warm``) and their host mounts (``mounts``).

A third engine is one dialect module and one row in ``backends/__init__.py`` (``KINDS``); a
third workspace mode is one module in ``modes/`` and one row in ``backend.MODES``.
"""
