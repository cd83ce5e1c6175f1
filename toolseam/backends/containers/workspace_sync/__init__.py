"""The workspace carried into a sandbox that shares no filesystem with the host, and back
(``tar_sync``: pack, spool, apply under the copy-back rule)."""
