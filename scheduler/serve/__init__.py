"""The scheduler's outside: the Unix socket API and its client, the daemon that runs the loop beside it (one
per state directory, `lock`), and the outward channels (Prometheus metrics, notifications).

The top of the scheduler: may import anything below it; nothing in `scheduler` imports it but `scheduler.ssh.shell`
for a type.
"""
