"""The agent runtime a container runs: ``staged`` (this interpreter and the agent, staged on the
host) and ``foreign_arch`` (the same for another CPU, from Debian packages)."""
