"""From config to jobs, before anything runs: the config, typed once (experiment, config),
the jobs, lanes and server sessions (plan), how long a grid takes (estimate) and what the
memory bandwidth allows (roofline)."""
