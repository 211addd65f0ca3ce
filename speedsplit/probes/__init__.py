"""Instruments that measure without serving: the load generator (loadgen), server and GPU
telemetry (telemetry), latency objectives (slo), the load generator's own ceiling (ceiling)
and a command's peak memory (peakmem)."""
