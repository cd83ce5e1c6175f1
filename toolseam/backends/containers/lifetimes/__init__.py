"""How long a container's session lives, the hooks a workspace mode asks of it
(``sandbox.ContainerLifetime``): ``ephemeral`` (it ends with its client) and ``durable`` (it
outlives its client). ``backend.LIFETIMES`` pairs each with the backend's ``lifetime`` option;
no mode imports a lifetime, and no lifetime a mode."""
