"""The workspace modes, one module each (``bind``, ``copy``), and their durable variants
(``durable_bind``, ``durable_copy``; ``durable`` is the table from mode to durable variant)."""
