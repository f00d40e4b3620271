"""bin/bench: FlowForge measured against this machine's own limits, in the same run.

Kept out of the `flowforge` package on purpose: it drives real processes, needs wrk,
pgbench and rabbitmqctl, and is a development tool, not something a deployment ships.
No module here starts with `test_`, so pytest never collects it.
"""
