"""Test helpers: engines and backend lists, processes, servers, clients, shared fixtures.

Scripts run as programs (``hold_job.py``, ``durable_client.py``, ``egress_client.py`` …) live
here too. No test module imports another test module: what two need is here."""
