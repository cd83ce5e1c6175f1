"""The container wing: one backend over any engine that speaks the docker API family.

* ``errors`` — the typed engine errors (not found, unreachable, conflict, permanent), every SDK
  and transport failure mapped to one of them once;
* ``engine`` — ``SdkEngine``, the ONE engine implementation, over a small per-SDK ``Dialect``;
* ``docker_dialect`` / ``podman_dialect`` — what docker-py and podman-py do differently (each
  imports its SDK, an extra).

A third engine is one new dialect module and one row in ``backends/__init__.py``.
"""
