"""The session and its public helpers: ``Toolkit`` (async) and ``SyncToolkit``, the raw
exec/bytes API (``raw``), sessions that outlive their client (``durable``), warm pools
(``sandbox_pool``, loaded by ``lazy_sandbox_pool``) and the tool declarations each front end
shows (``declarations``). Everything here is backend-agnostic: it asks the seam
(``toolseam.seam``) for facts and capabilities, never a backend's name or class."""
